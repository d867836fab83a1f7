"""--api-server-count 2: two API server processes on one port, each with its own engine links,
serving at once, and one /metrics for the whole frontend whichever process answers the scrape."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.support.procs import start_engine, start_frontend

REQUESTS = 40


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_api_servers_share_the_port_and_answer_one_metrics(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "5")
    fe = start_frontend(tmp_path, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                        "--engine-addresses", engine.endpoint(), "--api-server-count", "2")
    try:
        deadline = time.monotonic() + 60
        while fe.log().count("engine rank(s) ready") < 2:  # both processes up, each with its engine link
            assert time.monotonic() < deadline, fe.log()
            time.sleep(0.1)

        def one(i: int) -> int:
            with httpx.Client(timeout=30) as client:  # a connection each: the kernel spreads them
                r = client.post(fe.url + "/v1/completions",
                                json={"model": "tiny", "prompt": f"hi {i}", "max_tokens": 4, "ignore_eos": True})
                assert r.status_code == 200, r.text
                return int(r.json()["usage"]["completion_tokens"])

        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(one, range(REQUESTS))) == REQUESTS * 4
        # The engine's Stats (every 100 ms; an API server with nothing in flight reads them every half second)
        # may not count the last ones yet, and each process's own gauges are refreshed every second: wait
        # until six scrapes in a row (each lands on either process) see the load settled.
        deadline, settled = time.monotonic() + 10, 0
        while settled < 6:
            with httpx.Client(timeout=10) as client:
                text = client.get(fe.url + "/metrics").text
            tokens = _metric(text, "vllm:prompt_tokens_total") + _metric(text, "vllm:generation_tokens_total")
            ok = (not _metric(text, "vllm:num_requests_running") and _metric(text, "fleet:engines_ready") == 1
                  and _metric(text, "vllm:iteration_tokens_total_sum", engine="0") == tokens)
            settled = settled + 1 if ok else 0
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        for _ in range(6):  # each scrape may land on either process: every one sees both
            with httpx.Client(timeout=10) as client:
                text = client.get(fe.url + "/metrics").text
            assert _metric(text, "vllm:request_success_total", finished_reason="length") == REQUESTS
            assert _metric(text, "vllm:generation_tokens_total") == REQUESTS * 4
            assert _metric(text, "vllm:num_requests_running") == 0 == _metric(text, "fleet:requests_in_flight")
            assert _metric(text, "vllm:e2e_request_latency_seconds_count") == REQUESTS
            # Each process observes its own requests' engine timings: together, every request once.
            assert _metric(text, "vllm:request_queue_time_seconds_count", engine="0") == REQUESTS
            # The engine's counters come from its Stats, once whichever process answers: tokens per step
            # as vLLM counts them (no prompt here fills a block, so none is a cache hit), not doubled.
            tokens = _metric(text, "vllm:prompt_tokens_total") + _metric(text, "vllm:generation_tokens_total")
            assert _metric(text, "vllm:iteration_tokens_total_sum", engine="0") == tokens
            assert re.search(r'^fleet:engines_ready\{model_name="tiny"\} 1\.0$', text, re.M), text
    finally:
        fe.stop()
        engine.stop()
