"""A response's head and first body written as one transport write under uvicorn's httptools request
cycle (http_api/response_start.py): the same bytes as two ASGI sends, in one write; a close asked for
after them; two sends when the transport is paused, and under another server."""
from __future__ import annotations

import asyncio
import logging

from starlette.types import Message
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from services.frontend.http_api.asgi import send_json
from services.frontend.http_api.response_start import start_response

START: Message = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
FIRST: Message = {"type": "http.response.body", "body": b"data: one\n\n", "more_body": True}


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed_after = -1  # how many writes there were when it was closed

    def write(self, data: bytes) -> None:
        assert self.closed_after < 0, "a write after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed_after >= 0

    def close(self) -> None:
        self.closed_after = len(self.writes)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _cycle(keep_alive: bool = True) -> tuple[RequestResponseCycle, _Transport]:
    transport = _Transport()
    log = logging.getLogger("test")
    cycle = RequestResponseCycle({"type": "http", "method": "POST", "path": "/", "http_version": "1.1",  # type: ignore[typeddict-item]
                                  "headers": []},
                                 transport, FlowControl(transport), log, log, False,  # type: ignore[arg-type]
                                 [(b"server", b"uvicorn")], asyncio.Event(), False, keep_alive, lambda: None)
    return cycle, transport


def test_the_head_and_first_chunk_are_one_write_of_the_bytes_two_sends_make() -> None:
    async def main() -> tuple[list[bytes], list[bytes], bool]:
        one, one_transport = _cycle()
        await start_response(one.send, START, FIRST)
        two, two_transport = _cycle()
        await two.send(START)
        await two.send(FIRST)
        await one.send({"type": "http.response.body", "body": b"", "more_body": False})  # the state is uvicorn's
        return one_transport.writes, two_transport.writes, one.response_complete

    gathered, separate, complete = asyncio.run(main())
    assert len(gathered) == 2 and len(separate) == 2  # head and chunk; then the end, one write
    assert gathered[0] == b"".join(separate) and gathered[0].startswith(b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\n")
    assert gathered[0].endswith(b"transfer-encoding: chunked\r\n\r\nb\r\ndata: one\n\n\r\n")
    assert gathered[1] == b"0\r\n\r\n" and complete


def test_a_json_answer_is_one_write_and_a_close_follows_it() -> None:
    async def main() -> _Transport:
        cycle, transport = _cycle(keep_alive=False)
        await send_json(cycle.send, 400, b'{"error":{}}')
        return transport

    transport = asyncio.run(main())
    assert len(transport.writes) == 1 and transport.closed_after == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in head
    assert body == b'c\r\n{"error":{}}\r\n0\r\n\r\n'  # chunked, its end in the same write


def test_a_paused_transport_and_other_servers_get_two_sends() -> None:
    async def main() -> tuple[list[bytes], list[Message]]:
        cycle, transport = _cycle()
        cycle.flow.write_paused = True  # the head waits for the transport through uvicorn's send
        asyncio.get_running_loop().call_soon(cycle.flow.resume_writing)
        await start_response(cycle.send, START, FIRST)
        sent: list[Message] = []

        async def other(message: Message) -> None:  # not uvicorn's
            sent.append(message)

        await start_response(other, START, FIRST)
        return transport.writes, sent

    writes, sent = asyncio.run(main())
    assert len(writes) == 2 and writes[0].startswith(b"HTTP/1.1 200") and writes[1] == b"b\r\ndata: one\n\n\r\n"
    assert sent == [START, FIRST]
