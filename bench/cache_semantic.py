"""The semantic cache through a router process with a real embedding model: all-MiniLM-L6-v2 served by a
managed vLLM deployment on this host's CPU. The 40 questions of bench/data/paraphrases.json are asked
(misses, stored), then their paraphrases (a semantic hit when similar enough, else a miss) and their
near misses (which must not hit), then the questions again (exact hits). Prints the hit rates the router
itself reports (x-router-cache) and each outcome's latency, p50 and p99 in milliseconds, beside the same
questions on an entry without the cache. Upstream is the test backend, answering at once.
Usage: .venv/bin/python bench/cache_semantic.py [--threshold 0.85]
"""
from __future__ import annotations

import argparse
import json
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
  emb:
    model: minilm
    tasks: [embed]
    managed: {backend: vllm, engine_args: [--max-model-len, "256", --kv-cache-bytes, "4194304"]}
store: {backend: sqlite, path: "DB"}
entries:
  plain: {default: [chat]}
  assistant:
    default: [chat]
    plugins: [{type: semantic_cache, embedder: emb, threshold: THRESHOLD, timeout_s: 30}]
"""


def _ask(client: httpx.Client, model: str, text: str) -> tuple[float, str]:
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": text}]})
    elapsed = (time.perf_counter() - started) * 1000
    r.raise_for_status()
    outcome = r.headers.get("x-router-cache", "-")
    if outcome == "hit":
        outcome += "_" + r.headers["x-router-cache-match"]
    return elapsed, outcome


def _row(name: str, ms: list[float]) -> str:
    if not ms:
        return f"{name:<34} {'-':>8} {'-':>8} {0:>4}"
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{name:<34} {statistics.median(ms):>8.2f} {p99:>8.2f} {len(ms):>4}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threshold", type=float, default=0.85)
    args = parser.parse_args()
    triples = json.loads((ROOT / "bench/data/paraphrases.json").read_text())
    by_outcome: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), CONFIG.replace("THRESHOLD", str(args.threshold)), ready_s=600)
        try:
            with httpx.Client(base_url=fleet.router.url, headers={"authorization": f"Bearer {KEY_A}"},
                              timeout=120) as client:
                for i in range(10):  # warm-up: connections, the model's first batches (these hit each other)
                    _ask(client, "assistant", f"warm-up question {i} about nothing in the set")
                    _ask(client, "plain", f"warm-up question {i} about nothing in the set")
                time.sleep(1)  # the warm-up's last answers stored, in the background
                stored = fleet.stored()
                base = [_ask(client, "plain", q)[0] for q, _, _ in triples]
                for question, _, _ in triples:
                    ms, outcome = _ask(client, "assistant", question)
                    by_outcome.setdefault(f"question: {outcome}", []).append(ms)
                fleet.wait_stored(stored + len(by_outcome.get("question: miss", [])), timeout_s=60)
                # Paraphrases and near misses asked in turn, each answered by cache or upstream; what a miss
                # stores can serve a later one, as in service, so near misses are asked after every paraphrase.
                for _, paraphrase, _ in triples:
                    ms, outcome = _ask(client, "assistant", paraphrase)
                    by_outcome.setdefault(f"paraphrase: {outcome}", []).append(ms)
                for _, _, near in triples:
                    ms, outcome = _ask(client, "assistant", near)
                    by_outcome.setdefault(f"near miss: {outcome}", []).append(ms)
                for question, _, _ in triples:
                    ms, outcome = _ask(client, "assistant", question)
                    by_outcome.setdefault(f"question again: {outcome}", []).append(ms)
        finally:
            fleet.stop()
    n = len(triples)
    hits = len(by_outcome.get("paraphrase: hit_semantic", []))
    false = sum(len(v) for k, v in by_outcome.items() if k.startswith("near miss: hit"))
    print(f"all-MiniLM-L6-v2 (vLLM, CPU), threshold {args.threshold}, {n} questions; milliseconds")
    print(f"paraphrases answered from cache: {hits}/{n} ({100 * hits / n:.0f}%); "
          f"near misses answered from cache (false hits): {false}/{n} ({100 * false / n:.0f}%)")
    print(f"{'':<34} {'p50':>8} {'p99':>8} {'n':>4}")
    print(_row("no cache", base))
    for name in sorted(by_outcome):
        print(_row(name, by_outcome[name]))


if __name__ == "__main__":
    main()
