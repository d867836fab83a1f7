"""The frontend's request body read (services/frontend/http_api/asgi.py): joined, under its size limit,
and given up with a 408 when the body stops arriving (a fake receive that stalls)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from starlette.types import Message, Receive
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from services.frontend.errors import APIError
from services.frontend.http_api.asgi import ClientGone, read_body


def _scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
    return {"type": "http", "headers": list(headers)}


def test_pieces_are_joined_and_the_limit_enforced() -> None:
    def receive() -> Receive:
        pieces = [{"type": "http.request", "body": b"ab", "more_body": True},
                  {"type": "http.request", "body": b"cd", "more_body": False}]

        async def next_piece() -> Message:
            return pieces.pop(0)

        return next_piece

    assert asyncio.run(read_body(_scope(), receive(), 4, 10.0)) == b"abcd"
    with pytest.raises(APIError, match="exceeds the limit of 3 bytes"):
        asyncio.run(read_body(_scope(), receive(), 3, 10.0))


def test_a_body_that_stalls_is_a_408_and_its_receive_is_not_left_waiting() -> None:
    async def main() -> tuple[APIError, bool]:
        never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        messages: list[Message] = [{"type": "http.request", "body": b"ab", "more_body": True}]

        async def receive() -> Message:
            return messages.pop(0) if messages else await never  # a few bytes, then nothing

        with pytest.raises(APIError) as raised:
            await read_body(_scope((b"content-length", b"10")), receive, 100, 0.05)
        await asyncio.sleep(0)  # let the cancellation land
        return raised.value, never.cancelled()

    error, receive_cancelled = asyncio.run(main())
    assert error.status == 408 and error.message == "the request's body stopped arriving: no bytes came for 0.05 s"
    assert b'"code":408' in error.body() and b'"type":"invalid_request_error"' in error.body()
    assert receive_cancelled


def test_a_client_gone_mid_body_is_no_one_to_answer() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientGone):
        asyncio.run(read_body(_scope(), receive, 100, 10.0))


def test_a_deadline_passed_while_the_loop_was_blocked_is_not_the_clients() -> None:
    """The bytes came during a stall of our own loop, and reach receive() some turns after it."""
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message] = asyncio.Queue()

        def stall() -> None:  # the body's last bytes arrive, two hops from receive(), as the loop blocks
            loop.call_soon(loop.call_soon, queue.put_nowait,
                           {"type": "http.request", "body": b"cd", "more_body": False})
            time.sleep(0.3)  # the loop blocked past the 0.05 s deadline (a stimulus, not a wait)

        loop.call_later(0.01, stall)
        return await read_body(_scope(), queue.get, 100, 0.05)

    assert asyncio.run(main()) == b"cd"


def test_a_body_uvicorn_holds_already_is_read_with_no_deadline_armed() -> None:
    """Its receive() returns at once (the body came with the headers): no timer to set and cancel."""
    async def main() -> tuple[bytes, int]:
        loop = asyncio.get_running_loop()
        log = logging.getLogger("test")
        transport = _Transport()
        cycle = RequestResponseCycle({"type": "http", "method": "POST", "headers": []},  # type: ignore[typeddict-item]
                                     transport, FlowControl(transport), log, log, False, [],  # type: ignore[arg-type]
                                     asyncio.Event(), False, True, lambda: None)
        cycle.body, cycle.more_body = bytearray(b"{}"), False
        cycle.message_event.set()  # as uvicorn's on_message_complete leaves them
        timers = 0
        call_at = loop.call_at

        def counted(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_at(*args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign]
        body = await read_body(_scope(), cycle.receive, 100, 10.0)
        await read_body(_scope(), _stalls_then_ends(), 100, 10.0)  # a receive that waits: one deadline
        return body, timers

    assert asyncio.run(main()) == (b"{}", 1)


class _Transport:
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False


def _stalls_then_ends() -> Receive:
    async def receive() -> Message:
        await asyncio.sleep(0)
        return {"type": "http.request", "body": b"", "more_body": False}

    return receive
