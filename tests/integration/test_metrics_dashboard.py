"""vLLM's published Grafana dashboard (examples/online_serving/prometheus_grafana/grafana.json in
vllm-project/vllm) charts these metric names, each with a `model_name` label. After a few requests
the frontend's /metrics carries every one, the engine-side request timings (protocol 1.4) too."""
from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support.procs import start_engine, start_frontend

# Every name the dashboard's queries read, as a series name (histograms by their _bucket/_sum/_count).
DASHBOARD = {
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:gpu_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
}


def test_the_names_vllms_dashboard_charts_are_served(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1")
    fe = start_frontend(tmp_path, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                        "--engine-addresses", engine.endpoint())
    try:
        with httpx.Client(base_url=fe.url, timeout=30) as client:
            for stream in (False, True):
                r = client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 4, "stream": stream,
                                                              "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
            text = client.get("/metrics").text
        served = {m.group(1) for m in re.finditer(r'^([a-zA-Z0-9_:]+)\{[^}]*model_name="tiny"', text, re.M)}
        assert DASHBOARD <= served, sorted(DASHBOARD - served)
    finally:
        fe.stop()
        engine.stop()
