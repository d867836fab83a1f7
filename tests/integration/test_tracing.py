"""One trace per request across real processes: a router, a frontend (with --grpc-port) and a headless sim
engine, each exporting OTLP/HTTP to a receiver this test runs. One request yields one trace with the
router's, the frontend's and the engine's spans, linked parent to child across the three processes; a
client's traceparent (HTTP header, gRPC metadata) is continued."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest

from protocol.grpc import pb2, pb2_grpc
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.procs import (
    EngineProc,
    FrontendProc,
    HttpProc,
    free_port_block,
    start_engine,
    start_frontend,
    start_router,
)

KEY = "sk-trace-test"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
ROUTER_SPANS = {"router.request", "router.signals", "router.decision", "router.admission", "router.upstream"}
FRONTEND_SPANS = {"frontend.request", "frontend.translate", "frontend.generate", "frontend.first_token",
                  "frontend.engine_queue"}
ENGINE_SPANS = {"engine.request", "engine.queued", "engine.prefill", "engine.decode"}


class Fleet:
    def __init__(self, receiver: OtlpReceiver, router: HttpProc, frontend: FrontendProc, grpc_port: int) -> None:
        self.receiver, self.router, self.frontend, self.grpc_port = receiver, router, frontend, grpc_port


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("tracing")
    procs: list[EngineProc | HttpProc] = []
    with OtlpReceiver() as receiver, pytest.MonkeyPatch.context() as env:
        # Every process inherits these: http/protobuf for the flag (vLLM's default for it is grpc), and a
        # short batch delay so spans arrive while the test waits (shutdown flushes the rest anyway).
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER"):
            env.delenv(name, raising=False)
        try:
            # The engine is configured from the environment alone, the others by the flag.
            engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1",
                                  env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint})
            procs.append(engine)
            grpc_port = free_port_block(1, spread=0)
            frontend = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                                      "--grpc-port", str(grpc_port), "--otlp-traces-endpoint", receiver.endpoint)
            procs.append(frontend)
            router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}]}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {frontend.url}}}]}}
entries:
  assistant:
    signals:
      - {{name: hello, type: keyword, keywords: [hello]}}
    decisions:
      - {{name: greeting, when: hello, pools: [tiny]}}
    default: [tiny]
""", "--otlp-traces-endpoint", receiver.endpoint)
            procs.append(router)
            yield Fleet(receiver, router, frontend, grpc_port)
        finally:
            for proc in reversed(procs):
                proc.stop()


def _chat(fleet: Fleet, headers: dict[str, str] | None = None) -> httpx.Response:
    r = httpx.post(fleet.router.url + "/v1/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {KEY}", **(headers or {})},
                   json={"model": "assistant", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    return r


def _trace_with(names: set[str], trace_id: str | None = None) -> Callable[[list[ReceivedSpan]], bool]:
    """Done once one trace (this one, if given) holds a span of every name."""
    def done(spans: list[ReceivedSpan]) -> bool:
        by_trace: dict[str, set[str]] = {}
        for s in spans:
            by_trace.setdefault(s.trace_id, set()).add(s.name)
        return any(names <= got for tid, got in by_trace.items() if trace_id is None or tid == trace_id)
    return done


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    [span] = [s for s in spans if s.name == name]
    return span


def test_one_request_is_one_trace_across_router_frontend_and_engine(fleet: Fleet) -> None:
    fleet.receiver.clear()
    _chat(fleet)
    spans = fleet.receiver.wait_for(_trace_with(ROUTER_SPANS | FRONTEND_SPANS | ENGINE_SPANS))
    [trace_id] = {s.trace_id for s in spans if s.name == "router.request"}
    spans = [s for s in spans if s.trace_id == trace_id]
    assert {s.name for s in spans} >= ROUTER_SPANS | FRONTEND_SPANS | ENGINE_SPANS
    by_name = {s.name: s for s in spans}
    services = {s.name.split(".")[0]: s.service for s in spans}
    assert services == {"router": "router", "frontend": "frontend", "engine": "engine"}

    def parent(name: str) -> str:
        span = by_name[name]
        [up] = [s.name for s in spans if s.span_id == span.parent_id]
        return up

    root = by_name["router.request"]
    assert root.parent_id == ""  # the client sent no traceparent: a new trace
    assert root.attributes["http.response.status_code"] == 200
    for child in ("router.signals", "router.decision", "router.admission", "router.upstream"):
        assert parent(child) == "router.request"
    assert by_name["router.decision"].attributes["router.decision"] == "greeting"
    assert by_name["router.admission"].attributes["router.admission.outcome"] == "admitted"
    upstream = by_name["router.upstream"]
    assert upstream.attributes["server.address"] == fleet.frontend.url
    assert upstream.attributes["http.response.status_code"] == 200
    # Across processes: the router's attempt -> the frontend's server span -> its engine request -> the engine's.
    assert parent("frontend.request") == "router.upstream"
    for child in ("frontend.translate", "frontend.generate"):
        assert parent(child) == "frontend.request"
    for child in ("frontend.first_token", "frontend.engine_queue"):
        assert parent(child) == "frontend.generate"
    assert parent("engine.request") == "frontend.generate"
    for child in ("engine.queued", "engine.prefill", "engine.decode"):
        assert parent(child) == "engine.request"
    generate, engine = by_name["frontend.generate"], by_name["engine.request"]
    for span in (generate, engine):
        assert span.attributes["gen_ai.response.finish_reasons"] == ["length"]
        assert span.attributes["gen_ai.usage.completion_tokens"] == 4
    assert engine.attributes["gen_ai.usage.prompt_tokens"] == generate.attributes["gen_ai.usage.prompt_tokens"] > 0
    queued, prefill = by_name["engine.queued"], by_name["engine.prefill"]
    assert engine.start_ns <= queued.start_ns <= queued.end_ns <= prefill.start_ns <= prefill.end_ns <= engine.end_ns


def test_a_clients_traceparent_is_continued(fleet: Fleet) -> None:
    fleet.receiver.clear()
    _chat(fleet, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"})
    spans = fleet.receiver.wait_for(_trace_with({"router.request", "frontend.request", "engine.request"},
                                                CLIENT_TRACE))
    root = _one([s for s in spans if s.trace_id == CLIENT_TRACE], "router.request")
    assert root.parent_id == CLIENT_PARENT


def test_an_upstream_refusal_is_an_attempt_of_its_own(fleet: Fleet) -> None:
    """A request the frontend refuses (max_tokens past the context): the attempt span says its status."""
    fleet.receiver.clear()
    r = httpx.post(fleet.router.url + "/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {KEY}"},
                   json={"model": "assistant", "max_tokens": 10**9, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    spans = fleet.receiver.wait_for(_trace_with({"router.request", "router.upstream", "frontend.request"}))
    upstream = _one(spans, "router.upstream")
    assert upstream.attributes["http.response.status_code"] == 400
    frontend = _one(spans, "frontend.request")
    assert frontend.parent_id == upstream.span_id and frontend.attributes["http.response.status_code"] == 400
    # A refusal of the client's request is not the servers' error (OpenTelemetry's HTTP conventions): unset.
    assert frontend.status_code == 0 and _one(spans, "router.request").status_code == 0


def test_a_traceparent_in_grpc_metadata_is_continued(fleet: Fleet) -> None:
    fleet.receiver.clear()
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with grpc.insecure_channel(f"127.0.0.1:{fleet.grpc_port}") as channel:
        resp = pb2_grpc.InferenceStub(channel).Generate(
            pb2.GenerateRequest(token_ids=[1, 2, 3, 4], sampling_params=pb2.SamplingParams(max_tokens=3)),
            metadata=(("traceparent", f"00-{trace_id}-{parent}-01"),), timeout=30)
    assert len(resp.token_ids) == 3
    spans = fleet.receiver.wait_for(_trace_with({"frontend.request", "frontend.generate", "engine.request"}, trace_id))
    spans = [s for s in spans if s.trace_id == trace_id]
    server = _one(spans, "frontend.request")
    assert server.parent_id == parent and server.attributes["rpc.method"] == "Generate"
    assert _one(spans, "engine.request").parent_id == _one(spans, "frontend.generate").span_id


def test_a_router_that_does_not_trace_forwards_a_clients_traceparent(fleet: Fleet, tmp_path_factory:
                                                                      pytest.TempPathFactory) -> None:
    """W3C asks every hop to forward the context: the frontend and engine continue the client's trace."""
    router = start_router(tmp_path_factory.mktemp("untraced"), f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}]}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {fleet.frontend.url}}}]}}
entries:
  assistant: {{default: [tiny]}}
""")
    try:
        fleet.receiver.clear()
        trace_id, parent = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
        r = httpx.post(router.url + "/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {KEY}", "traceparent": f"00-{trace_id}-{parent}-01"},
                       json={"model": "assistant", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        spans = fleet.receiver.wait_for(_trace_with({"frontend.request", "engine.request"}, trace_id))
        server = _one([s for s in spans if s.trace_id == trace_id], "frontend.request")
        assert server.parent_id == parent  # the client's own span: no router span between
        assert not [s for s in spans if s.name.startswith("router.") and s.trace_id == trace_id]
    finally:
        router.stop()
