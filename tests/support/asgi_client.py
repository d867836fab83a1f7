"""An in-process HTTP client for an ASGI app, as uvicorn drives one: the request body, then
http.disconnect once the response is complete, or earlier when the client leaves."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message


@dataclass
class Answer:
    """What the client saw."""
    status: int
    headers: dict[str, str]
    body: bytes
    messages: list[Message] = field(repr=False)  # every ASGI message sent, in order

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The `data:` payloads of an event stream, JSON-decoded ([DONE] kept as the string)."""
        lines = [line[6:] for line in self.body.decode().split("\n") if line.startswith("data: ")]
        return [line if line == "[DONE]" else json.loads(line) for line in lines]


async def request(app: ASGIApp, method: str, path: str, body: Any = None, *, port: int = 8080,
                  headers: dict[str, str] | None = None, leave_after_chunks: int | None = None,
                  timeout_s: float = 10.0) -> Answer:
    """One request; `leave_after_chunks`: the client disconnects once that many body pieces arrived."""
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    sent: list[Message] = []
    gone = asyncio.Event()
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        pieces = sum(1 for m in sent if m["type"] == "http.response.body" and m.get("body"))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            gone.set()  # uvicorn reports a disconnect once the response is complete
        elif leave_after_chunks is not None and pieces >= leave_after_chunks:
            gone.set()

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "server": ("127.0.0.1", port),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    # A request left waiting is a failure, not a hang.
    await asyncio.wait_for(app(scope, receive, send), timeout_s)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_bytes = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body_bytes, sent)
