"""The router's ASGI helpers (services/router/listeners/asgi.py): the response state of a request, the
body read under its limit, and the disconnect watcher."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message

from services.router.errors import HTTPError
from services.router.listeners.asgi import (
    ClientGone,
    ResponseState,
    TrackedSend,
    read_body,
    send_json,
    watch_disconnect,
)


def _receiver(*messages: Message) -> Any:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return receive


def test_the_response_state_follows_what_was_sent() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def main() -> list[ResponseState]:
        tracked = TrackedSend(send)
        states = [tracked.state]
        await tracked({"type": "http.response.start", "status": 200, "headers": []})
        states.append(tracked.state)
        await tracked({"type": "http.response.body", "body": b"a", "more_body": True})
        states.append(tracked.state)
        await tracked.end()  # a response that broke off ends short
        states.append(tracked.state)
        await tracked.end()  # ...once
        return states

    assert asyncio.run(main()) == [ResponseState.NOT_STARTED, ResponseState.STARTED, ResponseState.STARTED,
                                   ResponseState.COMPLETE]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False} and len(sent) == 3


def test_send_json_sets_type_and_length() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(send_json(send, 404, b'{"x":1}', [(b"x-a", b"b")]))
    assert sent[0] == {"type": "http.response.start", "status": 404, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"7"), (b"x-a", b"b")]}
    assert sent[1] == {"type": "http.response.body", "body": b'{"x":1}', "more_body": False}


def test_read_body_joins_pieces_and_enforces_the_limit() -> None:
    pieces = ({"type": "http.request", "body": b"ab", "more_body": True},
              {"type": "http.request", "body": b"cd", "more_body": False})
    assert asyncio.run(read_body({"type": "http", "headers": []}, _receiver(*pieces), 4)) == b"abcd"
    with pytest.raises(HTTPError, match="exceeds the limit of 3 bytes") as counted:
        asyncio.run(read_body({"type": "http", "headers": []}, _receiver(*pieces), 3))
    assert counted.value.status == 413
    with pytest.raises(HTTPError, match="request body is 10 bytes; the limit is 4"):
        asyncio.run(read_body({"type": "http", "headers": [(b"content-length", b"10")]}, _receiver(), 4))
    with pytest.raises(ClientGone):
        asyncio.run(read_body({"type": "http", "headers": []}, _receiver({"type": "http.disconnect"}), 4))


def test_a_disconnect_cancels_the_handler_only_before_the_response_completed() -> None:
    async def noop(message: Message) -> None:
        pass

    async def main(complete: bool) -> tuple[bool, bool]:
        tracked = TrackedSend(noop)
        if complete:
            await tracked({"type": "http.response.body", "body": b"", "more_body": False})
        handler = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        gone = asyncio.Event()
        await watch_disconnect(_receiver({"type": "http.disconnect"}), handler, gone, tracked)
        await asyncio.sleep(0)  # let a cancellation land
        cancelled = handler.cancelled()
        handler.cancel()
        return gone.is_set(), cancelled

    assert asyncio.run(main(complete=False)) == (True, True)
    assert asyncio.run(main(complete=True)) == (False, False)
