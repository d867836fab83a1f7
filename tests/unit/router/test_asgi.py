"""The router's ASGI helpers (services/router/listeners/asgi.py): the response state of a request, the
body read under its limit and its deadline, and the disconnect watcher."""
from __future__ import annotations

import asyncio
import time
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
    assert asyncio.run(read_body({"type": "http", "headers": []}, _receiver(*pieces), 4, 10.0)) == b"abcd"
    with pytest.raises(HTTPError, match="exceeds the limit of 3 bytes") as counted:
        asyncio.run(read_body({"type": "http", "headers": []}, _receiver(*pieces), 3, 10.0))
    assert counted.value.status == 413
    with pytest.raises(HTTPError, match="request body is 10 bytes; the limit is 4"):
        asyncio.run(read_body({"type": "http", "headers": [(b"content-length", b"10")]}, _receiver(), 4, 10.0))
    with pytest.raises(ClientGone):
        asyncio.run(read_body({"type": "http", "headers": []}, _receiver({"type": "http.disconnect"}), 4, 10.0))


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


def test_a_body_that_stalls_is_a_408_that_closes_the_connection() -> None:
    async def main() -> tuple[HTTPError, bool]:
        never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        messages = [{"type": "http.request", "body": b"ab", "more_body": True}]

        async def receive() -> Message:
            return messages.pop(0) if messages else await never  # a few bytes, then nothing

        with pytest.raises(HTTPError) as raised:
            await read_body({"type": "http", "headers": [(b"content-length", b"10")]}, receive, 100, 0.05)
        await asyncio.sleep(0)  # let the cancellation land
        return raised.value, never.cancelled()

    error, receive_cancelled = asyncio.run(main())
    assert (error.status, error.headers) == (408, [(b"connection", b"close")])
    assert error.message == "the request's body stopped arriving: no bytes came for 0.05 s"
    assert receive_cancelled  # no receive() left waiting behind the answer


def test_a_deadline_passed_while_the_loop_was_blocked_is_not_the_clients() -> None:
    """The bytes came during a stall of our own loop, and reach receive() some turns after it: a stall
    of this process is not a silence of the client."""
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message] = asyncio.Queue()

        def stall() -> None:  # the body's last bytes arrive, two hops from receive(), as the loop blocks
            loop.call_soon(loop.call_soon, queue.put_nowait,
                           {"type": "http.request", "body": b"cd", "more_body": False})
            time.sleep(0.3)  # the loop blocked past the 0.05 s deadline (a stimulus, not a wait)

        loop.call_later(0.01, stall)
        return await read_body({"type": "http", "headers": []}, queue.get, 100, 0.05)

    assert asyncio.run(main()) == b"cd"


def test_a_read_cancelled_from_outside_stays_a_cancellation() -> None:
    """Shutdown or a client gone cancels the handler: not a 408 to send."""
    async def main() -> None:
        never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        async def receive() -> Message:
            return await never

        reader = asyncio.ensure_future(read_body({"type": "http", "headers": []}, receive, 100, 10.0))
        await asyncio.sleep(0)  # let it reach receive()
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader

    asyncio.run(main())
