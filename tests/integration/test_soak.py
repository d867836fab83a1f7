"""Soak: 2,000 short requests through the router to a frontend and a sim engine (real processes), 30%
of them given up by their client mid-stream or before the answer. Afterwards no service holds any
request state (router in-flight, frontend streams and running gauge, the engine's running and
waiting), and each process's resident memory grew within a bound. Prints the RSS figures."""
from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.support.procs import EngineProc, FrontendProc, HttpProc, Proc, start_engine, start_frontend, start_router

KEY = "sk-soak"
REQUESTS, WARM_UP, CONCURRENCY, CANCELLED = 2000, 300, 32, 0.3
RSS_GROWTH_LIMIT_MB = 40.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProc, FrontendProc, HttpProc]]:
    tmp = tmp_path_factory.mktemp("soak")
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "2")
    frontend = router = None
    try:
        frontend = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                  "--engine-addresses", engine.endpoint())
        router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}]}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {frontend.url}}}], max_inflight: 256, health: {{path: /ready, interval_s: 1}}}}
entries:
  tiny: {{default: [tiny]}}
""")
        yield engine, frontend, router
    finally:
        for proc in (router, frontend, engine):
            if proc is not None:
                proc.stop()


def _rss_mb(proc: Proc) -> float:
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) / 1024


async def _one(session: aiohttp.ClientSession, url: str, rng: random.Random, outcomes: Counter[str]) -> None:
    stream = rng.random() < 0.7
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
            "max_tokens": rng.randint(4, 24), "ignore_eos": True, "stream": stream}
    cancel = rng.random() < CANCELLED
    headers = {"authorization": f"Bearer {KEY}"}
    try:
        async with asyncio.timeout(60):  # nothing may hang
            if cancel and rng.random() < 0.3:  # given up before the answer came
                task = asyncio.ensure_future(session.post(url, json=body, headers=headers))
                await asyncio.sleep(rng.random() * 0.01)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                outcomes["cancelled before the answer"] += 1
                return
            async with session.post(url, json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                if cancel:  # given up mid-stream, after the first chunk
                    await resp.content.readline()
                    resp.close()
                    outcomes["cancelled mid-answer"] += 1
                    return
                text = await resp.text()
                assert ("data: [DONE]" in text) if stream else json.loads(text)["choices"][0]["finish_reason"]
                outcomes["completed"] += 1
    except TimeoutError:
        outcomes["hung"] += 1


async def _soak(url: str, n: int, seed: int) -> Counter[str]:
    rng, outcomes = random.Random(seed), Counter[str]()
    gate = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def guarded() -> None:
            async with gate:
                await _one(session, url, rng, outcomes)
        await asyncio.gather(*(guarded() for _ in range(n)))
    return outcomes


def _gauges(url: str, prefix: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefix)}


def _settled(engine_url: str, router_url: str) -> dict[str, float]:
    """Every in-flight gauge of the frontend and the router, once all are 0 or 5 s have passed."""
    deadline = time.monotonic() + 5
    while True:
        held = {**_gauges(engine_url, "fleet:engine_streams_open"), **_gauges(engine_url, "fleet:requests_in_flight"),
                **_gauges(engine_url, "vllm:num_requests_running"), **_gauges(engine_url, "vllm:num_requests_waiting"),
                **_gauges(router_url, "router_replica_inflight")}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def test_a_soak_with_cancellations_leaves_no_request_state_and_bounded_memory(
        fleet: tuple[EngineProc, FrontendProc, HttpProc]) -> None:
    engine, frontend, router = fleet
    url = router.url + "/v1/chat/completions"
    warm = asyncio.run(_soak(url, WARM_UP, seed=1))
    assert warm["hung"] == 0
    before = {name: _rss_mb(proc) for name, proc in (("engine", engine), ("frontend", frontend), ("router", router))}
    outcomes = asyncio.run(_soak(url, REQUESTS, seed=2))
    after = {name: _rss_mb(proc) for name, proc in (("engine", engine), ("frontend", frontend), ("router", router))}
    print(f"\nsoak: {REQUESTS} requests after {WARM_UP} to warm up: {dict(outcomes)}")
    for name in before:
        print(f"  {name:<9} RSS {before[name]:6.1f} MB -> {after[name]:6.1f} MB ({after[name] - before[name]:+.1f} MB)")
    assert outcomes["hung"] == 0 and sum(outcomes.values()) == REQUESTS
    assert outcomes["completed"] > REQUESTS * 0.6 and outcomes["cancelled mid-answer"] > 0
    held = _settled(frontend.url, router.url)
    assert held and not any(held.values()), f"request state left behind: {held}"
    for name in before:
        assert after[name] - before[name] < RSS_GROWTH_LIMIT_MB, f"{name} grew {after[name] - before[name]:.1f} MB"
    # Every service is still serving.
    assert httpx.get(frontend.url + "/ready", timeout=5).status_code == 200
