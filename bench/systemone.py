"""The System One API's figures: (1) the latency the router adds over its worker's own, for a concrete
classifier (tiny-classifier served by our engine `--runner pooling` and a frontend, attached to the
router: a managed worker's key is the router's alone), at 1 and 64 clients: the same text sent to the
router's POST /v1/systemone and to the worker's own POST /classify, in alternating rounds; (2) a native
escalate recipe on a mixed confidence set: calls per request, how many escalated, and latency, beside
each of its two stages called alone.

Usage: .venv/bin/python bench/systemone.py [--requests 200] [--rounds 3] [--backend sim|vllm]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import start_engine, start_frontend, start_router  # noqa: E402

CONFIG = """
listeners:
  - host: 127.0.0.1
    port: {{port}}
    apis: {{systemone: {{models: [fast, big, intent-auto]}}}}
pools: {{}}
entries:
  intent-auto:
    api: systemone
    default: [fast, big]
    algorithm: {{type: escalate, accept: {{min_probability: {threshold}}}}}
    budget: {{deadline_s: 10, max_calls: 2}}
deployments:
  fast: {{model: tiny-classifier, tasks: [classify], attached: {{urls: ["{worker}"]}}, max_inflight: 256}}
  big:
    model: tiny-classifier
    tasks: [classify]
    managed: {{backend: {backend}, engine_args: [--seed, "7"]}}
    max_inflight: 256
"""
WORDS = ("invoice", "python", "integral", "weather", "refund", "lemma", "docker", "poem", "matrix", "chat")


def texts(n: int) -> list[str]:
    """n distinct short questions: a classifier's confidence varies across them (a mixed set)."""
    return [f"question {i}: {WORDS[i % 10]} {WORDS[(i * 7) % 10]} {WORDS[(i * 3) % 10]} #{i}" for i in range(n)]


async def _clients(url: str, path: str, bodies: list[dict[str, Any]], clients: int) -> tuple[list[float], list[Any]]:
    """Every body sent once, `clients` at a time; each request's seconds and its JSON answer."""
    took: list[float] = [0.0] * len(bodies)
    answers: list[Any] = [None] * len(bodies)
    queue = list(range(len(bodies)))[::-1]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one() -> None:
            while queue:
                i = queue.pop()
                started = time.perf_counter()
                r = await client.post(path, json=bodies[i])
                took[i] = time.perf_counter() - started
                assert r.status_code == 200, (r.status_code, r.text[:300])
                answers[i] = r.json()
        await asyncio.gather(*(one() for _ in range(clients)))
    return took, answers


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1e3


def added_latency(router: str, worker: str, n: int, rounds: int) -> None:
    print("1. latency the router adds to a concrete classifier call (one text per request)")
    print(f"   {'clients':>7} {'worker p50':>11} {'router p50':>11} {'added p50':>10} {'worker p99':>11} "
          f"{'router p99':>11} {'added p99':>10}")
    for clients in (1, 64):
        corpus = texts(n if clients == 1 else 4 * n)  # 64 clients: enough requests per client for a p99
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(rounds):
            # The worker's own API and ours, alternating, on the same texts.
            t, _ = asyncio.run(_clients(worker, "/classify", [{"model": "tiny-classifier", "input": [x]}
                                                              for x in corpus], clients))
            theirs += t
            t, _ = asyncio.run(_clients(router, "/v1/systemone", [{"model": "fast", "input": x} for x in corpus],
                                        clients))
            ours += t
        cells = [_ms(theirs, .5), _ms(ours, .5), _ms(ours, .5) - _ms(theirs, .5),
                 _ms(theirs, .99), _ms(ours, .99), _ms(ours, .99) - _ms(theirs, .99)]
        print(f"   {clients:>7} " + " ".join(f"{c:>9.2f}ms" for c in cells))


def recipe(router: str, n: int, threshold: float) -> None:
    print(f"2. native escalate recipe intent-auto: fast then big, accepted at top probability >= {threshold}; "
          f"{n} distinct texts, one per request, 1 client")
    corpus = texts(n)
    rows = []
    for model in ("fast", "big", "intent-auto"):
        asyncio.run(_clients(router, "/v1/systemone", [{"model": model, "input": x} for x in corpus[:20]], 1))
        took, answers = asyncio.run(_clients(router, "/v1/systemone", [{"model": model, "input": x}
                                                                        for x in corpus], 1))
        if model == "intent-auto":
            calls = [a["routing"]["calls"] for a in answers]
            escalated = sum(1 for a in answers if a["data"][0]["stage"] != "fast")
            extra = (f"calls/request {statistics.mean(calls):.2f}, escalated {escalated}/{n} "
                     f"({100 * escalated / n:.0f}%)")
        else:
            extra = "calls/request 1.00"
        rows.append((model, _ms(took, .5), _ms(took, .99), statistics.mean(took) * 1e3, extra))
    for model, p50, p99, mean, extra in rows:
        print(f"   {model:<12} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  mean {mean:7.2f} ms  {extra}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=200, help="per round and client count")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threshold", type=float, default=0.6, help="the recipe's min_probability")
    p.add_argument("--backend", choices=("sim", "vllm"), default="sim", help="the classifier workers' engine")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = start_engine(Path(tmp), "--model", "tiny-classifier", "--backend", args.backend, "--runner", "pooling",
                              "--convert", "classify")
        fe = start_frontend(Path(tmp), "--model", "tiny-classifier", "--data-parallel-size-local", "0",
                            "--engine-addresses", engine.endpoint())
        router = start_router(Path(tmp), CONFIG.format(backend=args.backend, threshold=args.threshold, worker=fe.url))
        try:
            deadline = time.monotonic() + 600
            while httpx.get(router.url + "/ready", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, router.log()
                time.sleep(0.2)
            worker = fe.url
            print(f"backend {args.backend}; router {router.url}; fast worker {worker}")
            added_latency(router.url, worker, args.requests, args.rounds)
            recipe(router.url, args.requests, args.threshold)
        finally:
            router.stop()
            fe.stop()
            engine.stop()


if __name__ == "__main__":
    main()
