"""The semantic cache's latency through a router process: each of N distinct questions asked once on an
entry without the cache (the baseline), once on the cached entry (a miss: the lookup, an embedding call
to a managed sim worker, the upstream call, then the answer stored in the background) and again (an exact
hit: no embedding, no upstream call). Upstream is the test backend answering at once (`--delay-s` adds a
generation time), so a miss's figure is the router's cost, not a model's. Store: SQLite in a temporary
file. Sequential requests over one keep-alive connection; p50 and p99 in milliseconds.
Usage: .venv/bin/python bench/cache_latency.py [--n 300] [--delay-s 0]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.cache_fleet import KEY_A, Fleet  # noqa: E402

CONFIG = """
listeners:
  - {port: {port}, host: 127.0.0.1, api_keys: [key-a, key-b]}
pools:
  chat: {model: m, replicas: [{url: "BACKEND"}]}
deployments:
  emb: {model: minilm, tasks: [embed], managed: {backend: sim}}
store: {backend: sqlite, path: "DB"}
entries:
  plain: {default: [chat]}
  assistant:
    default: [chat]
    plugins: [{type: semantic_cache, embedder: emb}]
"""


def _timed(client: httpx.Client, model: str, text: str, expect: str | None) -> float:
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": text}]})
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    if expect is not None:
        assert r.headers["x-router-cache"] == expect, (text, r.headers.get("x-router-cache"))
    return elapsed * 1000


def _row(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{name:<22} {statistics.median(ms):>8.2f} {p99:>8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--delay-s", type=float, default=0.0, help="the backend's time to answer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), CONFIG)
        try:
            fleet.backend.configure(delay_s=args.delay_s)
            questions = [f"Question number {i}: how do I reset password {i}?" for i in range(args.n)]
            with httpx.Client(base_url=fleet.router.url, headers={"authorization": f"Bearer {KEY_A}"},
                              timeout=60) as client:
                for text in questions[:20]:  # warm-up: connections, the embedder's first calls
                    _timed(client, "plain", "warm " + text, None)
                    _timed(client, "assistant", "warm " + text, None)
                base = [_timed(client, "plain", text, None) for text in questions]
                miss = [_timed(client, "assistant", text, "miss") for text in questions]
                fleet.wait_stored(args.n + 20, timeout_s=60)
                hit = [_timed(client, "assistant", text, "hit") for text in questions]
        finally:
            fleet.stop()
    print(f"{args.n} questions, sequential, backend delay {args.delay_s * 1000:.0f} ms; milliseconds")
    print(f"{'':<22} {'p50':>8} {'p99':>8}")
    print(_row("no cache", base))
    print(_row("cache miss", miss))
    print(_row("cache hit (exact)", hit))


if __name__ == "__main__":
    main()
