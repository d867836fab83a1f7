"""A streamed chat request through the frontend's uvicorn protocol and app, in process (the tests' answering
engine bridge, a recording transport): its objects are freed by their reference counts when it ends, none
left in a cycle for the collector (whose passes over a busy server's young objects cost more than the
request's own work), the body read's deadline timer included; and its head and first events go out in one
write."""
from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Message
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from protocol import Abort, GenerateRequest, decode
from services.frontend.http_api.asgi import read_body
from services.frontend.http_api.connections import uvicorn_protocol
from services.frontend.http_api.direct_stream import cycle_of
from tests.support.frontend_app import frontend_app

BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                   "stream": True, "stream_options": {"include_usage": True}}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%b" % (len(BODY), BODY))


class _Transport:
    """Records what is written; closing it tells the protocol, as a real transport does a turn later."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes: list[bytes] = []
        self.closing = False
        self.protocol: Any = None
        self.answered = asyncio.Event()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes.append(data)
        if self.data.endswith(b"0\r\n\r\n"):  # the chunked body's end
            self.answered.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self._lost)

    def _lost(self) -> None:
        protocol, self.protocol = self.protocol, None  # as asyncio's and uvloop's transports let go of it
        protocol.connection_lost(None)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[uvicorn.Config, ServerState]]:
    """The app as the frontend serves it under uvicorn: its config (with the guarded protocol) and state."""
    frontend = frontend_app()
    config = uvicorn.Config(frontend, http=uvicorn_protocol(10.0, 100), ws="none", lifespan="off",
                            interface="asgi3", access_log=False, log_config=None, proxy_headers=False)
    config.load()
    yield config, ServerState()
    frontend.core.close()


async def _answer(server: tuple[uvicorn.Config, ServerState], request: bytes) -> _Transport:
    """One request on a connection of its own, the connection closed once the response has ended."""
    config, state = server
    protocol = config.http_protocol_class(config=config, server_state=state, app_state={})
    transport = _Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request)
    await asyncio.wait_for(transport.answered.wait(), 10)
    transport.close()
    await asyncio.sleep(0)  # connection_lost, called soon
    return transport


def test_a_streamed_request_leaves_no_reference_cycle(server: tuple[uvicorn.Config, ServerState]) -> None:
    async def main() -> tuple[bytes, int]:
        await _answer(server, REQUEST)  # the first request's one-time set-up (caches, lazily made objects)
        gc.collect()
        gc.disable()
        try:
            data = bytes((await _answer(server, REQUEST)).data)
            return data, gc.collect()
        finally:
            gc.enable()

    data, unreachable = asyncio.run(main())
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"data: [DONE]" in data and b'"usage":{' in data
    assert unreachable == 0


def test_a_body_read_leaves_no_reference_cycle() -> None:
    """Its deadline's timer callback re-arms itself: held in a closure, that was a cycle holding the task."""
    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def main() -> tuple[bytes, int]:
        gc.collect()
        gc.disable()
        try:
            body = await asyncio.get_running_loop().create_task(read_body({"headers": []}, receive, 100, 10.0))
            return body, gc.collect()
        finally:
            gc.enable()

    body, unreachable = asyncio.run(main())
    assert body == b"{}" and unreachable == 0


def test_the_stream_writes_through_the_uvicorn_cycle_behind_send() -> None:
    """The direct stream's cycle is found from the ASGI send uvicorn passes (its bound method), under
    no other server."""
    class Other:
        async def send(self, message: Message) -> None: ...

    async def main() -> None:
        transport = _Transport()
        log = logging.getLogger("test")
        cycle = RequestResponseCycle({"type": "http", "method": "POST", "headers": []},  # type: ignore[typeddict-item]
                                     transport, FlowControl(transport), log, log, False, [],  # type: ignore[arg-type]
                                     asyncio.Event(), False, True, lambda: None)
        assert cycle_of(cycle.send) is cycle

    asyncio.run(main())
    assert cycle_of(Other().send) is None
    assert cycle_of(lambda message: None) is None


def test_a_streamed_answer_starts_with_its_head_and_first_events_in_one_write(
        server: tuple[uvicorn.Config, ServerState]) -> None:
    """One send call, one wake-up of the client, where the head alone took one (response_start.py)."""
    transport = asyncio.run(_answer(server, REQUEST))
    first = transport.writes[0]
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"text/event-stream" in first
    assert b'"delta":{"role":"assistant","content":""}' in first


class _SilentBridge:
    """An engine that takes requests and never answers: the stream waits, its request at the engine."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.quiet = True

    def send(self, index: int, frames: list[Any]) -> None:
        self.sent.append(decode(frames))


def test_a_client_that_leaves_has_its_request_aborted_with_no_task_watching(
        server: tuple[uvicorn.Config, ServerState]) -> None:
    """The connection's connection_lost tells the request (connections.on_client_gone); no task per
    request waits on receive() for it."""
    config, state = server
    engines = config.loaded_app.core.engines  # type: ignore[attr-defined]
    answering, silent = engines._bridge, _SilentBridge()

    async def main() -> tuple[int, list[object]]:
        protocol = config.http_protocol_class(config=config, server_state=state, app_state={})
        transport = _Transport()
        transport.protocol = protocol
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(REQUEST)
        await until_sent(silent, GenerateRequest)
        tasks = len(asyncio.all_tasks())  # this test's and the request's
        transport.close()  # the client leaves
        await until_sent(silent, Abort)
        return tasks, silent.sent

    engines._bridge = silent
    try:
        tasks, sent = asyncio.run(main())
    finally:
        engines._bridge = answering
    assert tasks == 2
    request, abort = sent
    assert isinstance(request, GenerateRequest) and isinstance(abort, Abort)
    assert abort.request_ids == [request.request_id]


async def until_sent(bridge: _SilentBridge, kind: type) -> None:
    for _ in range(1000):
        if any(isinstance(m, kind) for m in bridge.sent):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no {kind.__name__} sent: {bridge.sent}")
