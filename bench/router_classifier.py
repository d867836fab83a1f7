"""The routing latency a classifier signal adds: non-streaming chat requests through a router to a
zero-delay test backend, for two entries of the same router in alternating rounds: `rules` (a keyword
signal decides) and `classified` (a classifier signal, answered by a managed worker of the router's
model runtime: our engine `--runner pooling` and a frontend, tiny-classifier). p50/p99 each way and
their difference, at concurrency 1 (one client, sequential requests).

Usage: .venv/bin/python bench/router_classifier.py [--requests 300] [--rounds 4] [--backend sim|vllm]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import start_backend, start_router  # noqa: E402

CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  chat: {{model: m, replicas: [{{url: "{chat}"}}]}}
entries:
  rules:
    signals: [{{name: code, type: keyword, keywords: [python]}}]
    decisions: [{{name: coding, when: code, pools: [chat]}}]
    default: [chat]
  classified:
    signals: [{{name: code, type: classifier, deployment: intent, labels: [chat, code, math], threshold: 0.0}}]
    decisions: [{{name: coding, when: code, pools: [chat]}}]
    default: [chat]
    signal_budget_s: 5
deployments:
  intent: {{model: tiny-classifier, tasks: [classify], managed: {{backend: {backend}}}}}
"""


def _round(client: httpx.Client, url: str, entry: str, n: int) -> list[float]:
    body = {"model": entry, "messages": [{"role": "user", "content": "fix my python code please"}]}
    took = []
    for _ in range(n):
        started = time.perf_counter()
        r = client.post(url + "/v1/chat/completions", json=body)
        took.append(time.perf_counter() - started)
        assert r.status_code == 200 and r.headers["x-router-decision"] == "coding", (r.status_code, r.text[:200])
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=300, help="per entry and round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--backend", choices=("sim", "vllm"), default="sim", help="the classifier worker's engine")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        chat = start_backend(Path(tmp), "chat")
        router = start_router(Path(tmp), CONFIG.format(chat=chat.url, backend=args.backend))
        try:
            deadline = time.monotonic() + 600
            while httpx.get(router.url + "/ready", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, router.log()
                time.sleep(0.2)
            times: dict[str, list[float]] = {"rules": [], "classified": []}
            with httpx.Client(timeout=30) as client:
                _round(client, router.url, "classified", 20)  # warm: connections, first calls
                for _ in range(args.rounds):
                    for entry in times:
                        times[entry] += _round(client, router.url, entry, args.requests)
        finally:
            router.stop()
            chat.stop()
    p50 = {e: percentile(t, 0.50) * 1e3 for e, t in times.items()}
    p99 = {e: percentile(t, 0.99) * 1e3 for e, t in times.items()}
    print(f"classifier worker: tiny-classifier, managed, backend {args.backend}; "
          f"{args.rounds} x {args.requests} requests per entry, concurrency 1")
    for entry in times:
        print(f"  {entry:<10} p50 {p50[entry]:7.2f} ms   p99 {p99[entry]:7.2f} ms")
    print(f"  added      p50 {p50['classified'] - p50['rules']:7.2f} ms   "
          f"p99 {p99['classified'] - p99['rules']:7.2f} ms")


if __name__ == "__main__":
    main()
