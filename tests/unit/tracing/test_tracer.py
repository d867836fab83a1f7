"""tracing/tracer.py and propagation.py: off makes no span object at all; on, spans nest, continue a W3C
parent from headers or metadata, and export on shutdown."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, Span, Tracer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracing
from tracing.settings import TracingSettings

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure_with(TracingSettings("test"), exporter)
    yield exporter
    tracing.shutdown()


def _spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    tracing.shutdown()  # flushes the batch processor
    return {s.name: s for s in exporter.get_finished_spans()}


def test_off_creates_no_span_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    original = Span.__init__

    def counting(self: Span, name: str, *args: object, **kwargs: object) -> None:
        made.append(name)
        original(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Span, "__init__", counting)
    monkeypatch.setattr(Tracer, "start_span", lambda *a, **k: pytest.fail("a span was started while off"))
    assert tracing.configure("router", None, {}) is None
    assert not tracing.enabled()
    with tracing.server_span("r", [(b"traceparent", PARENT.encode())]) as server, tracing.span("c") as child:
        assert server is None and child is None
    assert tracing.start_span("s", parent={"traceparent": PARENT}) is None
    assert tracing.current() is None
    assert made == []


def test_off_is_one_shared_context_manager() -> None:
    assert tracing.span("a") is tracing.span("b") is tracing.server_span("c", [])


def test_a_server_span_continues_the_traceparent_in_asgi_headers(exported: InMemorySpanExporter) -> None:
    headers = [(b"content-type", b"application/json"), (b"traceparent", PARENT.encode()),
               (b"tracestate", b"vendor=1")]
    with tracing.server_span("srv", headers, {"route": "/x"}) as server:
        assert server is not None
        with tracing.span("child") as child:
            assert child is tracing.current()
        sent = tracing.headers_of(server)
    spans = _spans(exported)
    srv, kid = spans["srv"], spans["child"]
    assert f"{srv.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert srv.parent is not None and srv.parent.span_id == 0xb7ad6b7169203331 and srv.parent.is_remote
    assert kid.parent is not None and kid.parent.span_id == srv.context.span_id
    assert srv.attributes == {"route": "/x"}
    assert sent["traceparent"] == f"00-0af7651916cd43dd8448eb211c80319c-{srv.context.span_id:016x}-01"
    assert sent["tracestate"] == "vendor=1"


def test_grpc_metadata_and_protocol_headers_carry_the_parent(exported: InMemorySpanExporter) -> None:
    with tracing.server_span("grpc", (("x-other", "1"), ("traceparent", PARENT))):
        pass
    remote = tracing.start_span("engine", parent={"traceparent": PARENT}, start_ns=1_000, attributes={"a": 1})
    assert remote is not None
    tracing.record_span(remote, "phase", 2_000, 3_000)
    remote.end(end_time=5_000)
    spans = _spans(exported)
    for name in ("grpc", "engine"):
        assert spans[name].parent is not None and spans[name].parent.span_id == 0xb7ad6b7169203331
    assert (spans["phase"].start_time, spans["phase"].end_time) == (2_000, 3_000)
    assert spans["phase"].parent is not None and spans["phase"].parent.span_id == spans["engine"].context.span_id


def test_a_bad_traceparent_starts_a_new_trace(exported: InMemorySpanExporter) -> None:
    with tracing.server_span("srv", [(b"traceparent", b"00-zz-nothex-01")]):
        pass
    assert _spans(exported)["srv"].parent is None


def test_shutdown_flushes_and_turns_it_off(exported: InMemorySpanExporter) -> None:
    with tracing.span("one"):
        pass
    tracing.shutdown()
    assert [s.name for s in exported.get_finished_spans()] == ["one"]
    assert not tracing.enabled()


def test_always_off_sampler_records_nothing() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure_with(TracingSettings("test", sampler="always_off"), exporter)
    with tracing.span("dropped"):
        pass
    tracing.shutdown()
    assert exporter.get_finished_spans() == ()
