"""The frontend's own ASGI plumbing for the lean generation routes: read the body, send a JSON
response, watch for the client leaving. Runs on each API server process's event loop."""
from __future__ import annotations

from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from services.frontend.engine_client.inflight import CLIENT_GONE
from services.frontend.errors import APIError

JSON_HEADERS = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client disconnected before its request body was read: there is no one to answer."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (`name` in lower case, as ASGI gives names)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body; 413 past `limit` bytes, refused early when content-length says so."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise APIError(413, f"request body is {int(value)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in Request(scope, receive).stream():  # starlette's reading of http.request messages
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + headers if headers else JSON_HEADERS})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def watch_disconnect(receive: Receive, on_disconnect: Callable[[str], None]) -> None:
    """hypercorn speaks ASGI 2.1: the only way to see a client leave is to keep reading receive()."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect(CLIENT_GONE)
            return
