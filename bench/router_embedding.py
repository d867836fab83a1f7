"""Should the router keep its in-process embedding model? An embedding signal answered by the router's own
numpy all-MiniLM-L6-v2 (`local`) against the same signal answered by a managed worker of the model
runtime (`worker`: our engine `--runner pooling` + frontend on the same checkpoint), with a keyword
signal (`rules`) as the baseline, in alternating rounds of one run:

- latency: non-streaming chat requests through the router to a zero-delay test backend, p50/p99 per
  entry at concurrency 1 and 8, and what each embedding path adds over `rules`;
- memory: the router's RSS and USS (psutil) with no embedding path loaded (a router whose entries use only
  rules and the worker) and with the in-process one loaded (after its first request), and the RSS of the
  worker's processes.

Two routers, one zero-delay chat backend. Usage:
  .venv/bin/python bench/router_embedding.py [--requests 100] [--rounds 3] [--backend vllm|sim]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import start_backend, start_router  # noqa: E402

EXAMPLES = "[write a python function, fix this bug in my code, explain this stack trace]"
SIGNAL = "{{name: code, type: {type}, {extra}}}"
ENTRY = """
  {name}:
    signals: [{signal}]
    decisions: [{{name: coding, when: code, pools: [chat]}}]
    default: [chat]
    signal_budget_s: 10
"""
HEAD = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  chat: {{model: m, replicas: [{{url: "{chat}"}}]}}
entries:"""
DEPLOYMENT = """
deployments:
  minilm: {{model: minilm, tasks: [embed], managed: {{backend: {backend}{args}}}}}
"""
TEXT = "please fix the bug in my python code"


def entry(name: str, kind: str, extra: str) -> str:
    return ENTRY.format(name=name, signal=SIGNAL.format(type=kind, extra=extra))


RULES = entry("rules", "keyword", "keywords: [python]")
LOCAL = entry("local", "embedding", f"examples: {EXAMPLES}, threshold: 0.3")
WORKER = entry("worker", "embedding", f"examples: {EXAMPLES}, threshold: 0.3, deployment: minilm")


async def _round(client: httpx.AsyncClient, url: str, name: str, n: int, concurrency: int) -> list[float]:
    body = {"model": name, "messages": [{"role": "user", "content": TEXT}]}
    took: list[float] = []

    async def one_client(count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            r = await client.post(url + "/v1/chat/completions", json=body)
            took.append(time.perf_counter() - started)
            decision = r.headers.get("x-router-decision")
            assert r.status_code == 200 and decision == "coding", (r.status_code, r.text[:300])

    await asyncio.gather(*(one_client(n // concurrency) for _ in range(concurrency)))
    return took


def _wait_ready(url: str, log: object) -> None:
    deadline = time.monotonic() + 900
    while httpx.get(url + "/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, log
        time.sleep(0.2)


def _memory(pid: int) -> tuple[float, float]:
    info = psutil.Process(pid).memory_full_info()
    return info.rss / 2**20, info.uss / 2**20


def _children_rss(pid: int) -> float:
    return sum(c.memory_info().rss for c in psutil.Process(pid).children(recursive=True)) / 2**20


async def measure(urls: dict[str, str], rounds: int, requests: int, concurrency: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in urls}
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for name, url in urls.items():
            await _round(client, url, name, 10, 1)  # warm: connections, example embeddings
        for _ in range(rounds):
            for name, url in urls.items():
                times[name] += await _round(client, url, name, requests, concurrency)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=96, help="per entry, round and concurrency")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", choices=("vllm", "sim"), default="vllm", help="the embedding worker's engine")
    args = p.parse_args()
    vllm_limits = ", engine_args: [--max-model-len, '256', --kv-cache-bytes, '16777216']"
    engine_args = vllm_limits if args.backend == "vllm" else ""
    with tempfile.TemporaryDirectory() as tmp:
        chat = start_backend(Path(tmp), "chat")
        head = HEAD.format(chat=chat.url)
        # Router A never loads the in-process model: its entries use rules and the worker only.
        worker_router = start_router(Path(tmp), head + RULES + WORKER + DEPLOYMENT.format(backend=args.backend,
                                                                                           args=engine_args))
        local_router = start_router(Path(tmp), head + LOCAL)
        try:
            _wait_ready(worker_router.url, worker_router)
            _wait_ready(local_router.url, local_router)
            before = {"without in-process path (router A)": _memory(worker_router.proc.pid),
                      "with in-process path, before a request (router B)": _memory(local_router.proc.pid)}
            urls = {"rules": worker_router.url, "local": local_router.url, "worker": worker_router.url}
            results = {}
            for concurrency in (1, 8):
                results[concurrency] = asyncio.run(measure(urls, args.rounds, args.requests, concurrency))
            after = {"without in-process path (router A)": _memory(worker_router.proc.pid),
                     "with in-process path, after requests (router B)": _memory(local_router.proc.pid)}
            workers = _children_rss(worker_router.proc.pid)
        finally:
            worker_router.stop()
            local_router.stop()
            chat.stop()
    print(f"embedding signal: in-process numpy (local) vs managed worker (worker, backend {args.backend}, minilm) "
          f"vs keyword (rules); {args.rounds} rounds x {args.requests} requests per entry")
    for concurrency, times in results.items():
        print(f"concurrency {concurrency}:")
        p50 = {e: percentile(t, 0.50) * 1e3 for e, t in times.items()}
        p99 = {e: percentile(t, 0.99) * 1e3 for e, t in times.items()}
        for name in times:
            added = "" if name == "rules" else (f"   adds p50 {p50[name] - p50['rules']:7.2f} ms, "
                                                f"p99 {p99[name] - p99['rules']:7.2f} ms")
            print(f"  {name:<7} p50 {p50[name]:8.2f} ms   p99 {p99[name]:8.2f} ms{added}")
    print("router memory (MiB, RSS / USS):")
    for label, (rss, uss) in {**before, **after}.items():
        print(f"  {label:<52} {rss:7.1f} / {uss:7.1f}")
    print(f"  managed embedding worker processes (engine + frontend), RSS: {workers:7.1f}")


if __name__ == "__main__":
    main()
