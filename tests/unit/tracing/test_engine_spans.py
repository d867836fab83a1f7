"""The engine core loop's request spans (services/engine/request_trace.py) against fakes at its ports: a
request that carries a trace context gets `engine.request`, child of that context, with its phases and
counts; one without gets none; an aborted one's span ends at once as `abort`; off, nothing is made."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracing
from protocol import (
    Abort,
    GenerateRequest,
    Outputs,
    RequestOutput,
    RequestTimings,
    SamplingParams,
    decode,
    encode,
    make_hello,
)
from protocol.logprobs import Buffer
from services.engine.backend import BackendInfo, Load, StepResult
from services.engine.config import EngineConfig
from services.engine.core import CoreLoop

PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


class Bridge:
    pub_port = 5655

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent: list[Any] = []
        self.done = threading.Condition()

    def push(self, msg: Any) -> None:
        self.inbox.put((b"a", [_Frame(f) for f in encode(msg)]))

    def send(self, batch: list[tuple[bytes, Any]]) -> None:
        with self.done:
            self.sent += [decode(frames) for _, frames in batch]
            self.done.notify_all()

    def publish(self, batch: list[Any]) -> None:
        pass

    def finished(self, rid: str) -> str | None:
        return next((o.finish_reason for m in self.sent if isinstance(m, Outputs) for o in m.outputs
                     if o.request_id == rid and o.finish_reason), None)

    def wait_finished(self, rid: str) -> str:
        with self.done:
            assert self.done.wait_for(lambda: self.finished(rid) is not None, 5)
        return self.finished(rid)  # type: ignore[return-value]


class _Frame:
    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


class Backend:
    """One token per step; timings with the first token and the finish, as the sim's and vLLM's."""

    info = BackendInfo("fake", "0", "m", 64, 16, 8, 100, None)

    def __init__(self) -> None:
        self.running: dict[str, list[int]] = {}

    def add(self, rid: str, req: GenerateRequest) -> None:
        self.running[rid] = [0, req.sampling.max_tokens]

    def abort(self, ids: list[str]) -> None:
        for i in ids:
            self.running.pop(i, None)

    def has_work(self) -> bool:
        return bool(self.running)

    def step(self) -> StepResult:
        outs = []
        for rid, state in list(self.running.items()):
            state[0] += 1
            done = state[0] >= state[1]
            out = RequestOutput(rid, [state[0]], "length" if done else None)
            if state[0] == 1 or done:
                out.timings = RequestTimings(0.001, 0.002, 0.0 if state[0] == 1 else 0.003, 0)
            outs.append(out)
            if done:
                del self.running[rid]
        return StepResult(outs, num_tokens=len(outs))

    def load(self) -> Load:
        return Load(len(self.running), 0, 0.0)

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        raise ValueError(name)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def core() -> Iterator[tuple[Bridge, threading.Thread]]:
    bridge = Bridge()
    config = EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, client_timeout_s=30)
    loop = CoreLoop(config, Backend(), bridge, vocab_size=100)  # type: ignore[arg-type]
    bridge.push(make_hello("fe"))
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    yield bridge, thread
    loop.request_drain()
    thread.join(5)


def _req(rid: str, max_tokens: int, trace: dict[str, str] | None) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens), 0.0, trace_headers=trace)


def _spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    tracing.shutdown()
    return list(exporter.get_finished_spans())


def test_a_traced_request_is_one_span_with_its_phases(core: tuple[Bridge, threading.Thread]) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure_with(tracing.TracingSettings("engine"), exporter)
    try:
        bridge, _ = core
        bridge.push(_req("traced", 3, PARENT))
        bridge.push(_req("plain", 2, None))
        assert bridge.wait_finished("traced") == "length" and bridge.wait_finished("plain") == "length"
    finally:
        spans = _spans(exporter)
    by_name = {s.name: s for s in spans}
    assert sorted(by_name) == ["engine.decode", "engine.prefill", "engine.queued", "engine.request"]
    request = by_name["engine.request"]
    assert request.parent is not None and request.parent.span_id == 0xb7ad6b7169203331
    assert request.attributes is not None
    assert request.attributes["gen_ai.request.id"] == "traced"
    assert request.attributes["gen_ai.usage.completion_tokens"] == 3
    assert request.attributes["gen_ai.response.finish_reasons"] == ("length",)
    for phase in ("engine.queued", "engine.prefill", "engine.decode"):
        assert by_name[phase].parent is not None and by_name[phase].parent.span_id == request.context.span_id
    queued, prefill = by_name["engine.queued"], by_name["engine.prefill"]
    assert queued.end_time - queued.start_time == 1_000_000  # type: ignore[operator]
    assert queued.end_time == prefill.start_time and prefill.end_time - prefill.start_time == 2_000_000  # type: ignore[operator]
    assert [e.name for e in request.events] == ["first_token"]


def test_an_aborted_requests_span_ends_at_once(core: tuple[Bridge, threading.Thread]) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure_with(tracing.TracingSettings("engine"), exporter)
    try:
        bridge, _ = core
        bridge.push(_req("long", 10**9, PARENT))
        with bridge.done:
            assert bridge.done.wait_for(lambda: any(isinstance(m, Outputs) for m in bridge.sent), 5)
        bridge.push(Abort(["long"]))
        assert bridge.wait_finished("long") == "abort"
    finally:
        spans = _spans(exporter)
    [request] = [s for s in spans if s.name == "engine.request"]
    assert request.attributes is not None and request.attributes["gen_ai.response.finish_reasons"] == ("abort",)


def test_off_a_traced_request_makes_no_span(core: tuple[Bridge, threading.Thread],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("services.engine.request_trace.EngineTrace.start",
                        lambda *a: pytest.fail("a span was started while tracing is off"))
    tracing.shutdown()
    bridge, _ = core
    bridge.push(_req("traced", 2, PARENT))
    assert bridge.wait_finished("traced") == "length"
