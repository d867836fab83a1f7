"""The engine-side request metrics over real processes (sim engine, frontend): after a batch that outgrows
the engine's KV pool, /metrics has vLLM's request phase histograms for every request, with phases that
add up (prefill + decode = inference; with the queue time, within the frontend's e2e latency), and the
engine's preemptions and tokens per step."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import start_engine, start_frontend

REQUESTS, PROMPT, GENERATED = 8, 100, 100  # 13 blocks of 16 each at the end: 104 > the pool's 48
PHASES = ("queue_time_seconds", "prefill_time_seconds", "decode_time_seconds", "inference_time_seconds")


def _families(text: str) -> dict[str, list]:  # type: ignore[type-arg]
    """Each family's samples of engine rank 0 (or of no rank: the frontend's own), by family name."""
    return {f.name: [s for s in f.samples if s.labels.get("engine", "0") == "0"
                     and s.labels.get("model_name") == "tiny"] for f in text_string_to_metric_families(text)}


def _value(samples: list, name: str) -> float:  # type: ignore[type-arg]
    found = [s.value for s in samples if s.name == name]
    assert len(found) == 1, (name, found)  # one series per rank, however many processes serve
    return float(found[0])


def test_phase_histograms_preemptions_and_iteration_tokens_after_a_batch(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "2",
                          "--sim-prefill-tps", "20000", "--sim-num-kv-blocks", "48", "--max-model-len", "512")
    fe = start_frontend(tmp_path, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                        "--engine-addresses", engine.endpoint())
    try:
        def one(i: int) -> int:
            with httpx.Client(timeout=60) as client:  # distinct prompts: no prefix-cache hits
                r = client.post(fe.url + "/v1/completions", json={
                    "model": "tiny", "prompt": [1000 + 500 * i + j for j in range(PROMPT)], "max_tokens": GENERATED,
                    "ignore_eos": True, "stream": i % 2 == 1})
                assert r.status_code == 200, r.text
                return i

        with ThreadPoolExecutor(REQUESTS) as pool:
            assert sorted(pool.map(one, range(REQUESTS))) == list(range(REQUESTS))
        deadline = time.monotonic() + 10  # the engine's counters arrive with its next Stats (every 100 ms)
        while True:
            got = _families(httpx.get(fe.url + "/metrics", timeout=10).text)
            steps = got["vllm:iteration_tokens_total"]
            if _value(steps, "vllm:iteration_tokens_total_sum") == REQUESTS * (PROMPT + GENERATED):
                break
            assert time.monotonic() < deadline, steps
            time.sleep(0.1)
        sums = {}
        for phase in PHASES:
            samples = got[f"vllm:request_{phase}"]
            assert _value(samples, f"vllm:request_{phase}_count") == REQUESTS
            sums[phase] = _value(samples, f"vllm:request_{phase}_sum")
            buckets = [s.value for s in samples if s.name.endswith("_bucket")]
            assert buckets == sorted(buckets) and buckets[-1] == REQUESTS  # cumulative, +Inf holds them all
            assert sums[phase] >= 0
        # Every request decoded for 99 steps of at least 2 ms; someone waited for room in the pool.
        assert sums["decode_time_seconds"] >= REQUESTS * 0.002 * (GENERATED - 1)
        assert sums["queue_time_seconds"] > 0 and sums["prefill_time_seconds"] > 0
        # As vLLM defines them: inference = prefill + decode; and the engine's phases lie inside the
        # request's life as the frontend saw it (its e2e latency, on its own clock).
        inference = sums["prefill_time_seconds"] + sums["decode_time_seconds"]
        assert abs(inference - sums["inference_time_seconds"]) < 1e-6
        e2e = _value(got["vllm:e2e_request_latency_seconds"], "vllm:e2e_request_latency_seconds_sum")
        assert sums["queue_time_seconds"] + inference <= e2e
        preemptions = _value(got["vllm:num_preemptions"], "vllm:num_preemptions_total")
        assert preemptions > 0  # the pool holds fewer than the batch needs
        assert _value(got["vllm:request_num_preemptions"], "vllm:request_num_preemptions_sum") == preemptions
        # Steps with outputs: at least one per generated position; no more than every generated token's own.
        count = _value(steps, "vllm:iteration_tokens_total_count")
        assert GENERATED <= count <= REQUESTS * GENERATED
    finally:
        fe.stop()
        engine.stop()
