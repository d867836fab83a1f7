"""Router replica policies: cost of one cache_aware choose + insert (8 replicas, 2,000- and
20,000-char prompts; next to the same policy on a per-character dict trie), and the prefix hit rate of
a shared-prefix workload under cache_aware, round_robin, least_outstanding and the best placement.

Run: .venv/bin/python bench/router_policy.py [--repeats 5] [--calls 400]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Runnable as a plain script from a checkout that is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.router.backends.policies import Policy
from services.router.backends.policies.cache_aware import CacheAware, PrefixTree
from services.router.backends.policies.least_outstanding import LeastOutstanding
from services.router.backends.policies.round_robin import RoundRobin
from services.router.backends.pool import Lease, Pool
from services.router.backends.replica import Replica

ALPHABET = "abcdefghijklmnopqrstuvwxyz ,.\n"


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(ALPHABET, k=n))


class DictTrie:
    """The layout the radix tree avoids: one dict node per character (match and insert only)."""

    def __init__(self) -> None:
        self.root: dict[str, dict] = {}  # type: ignore[type-arg]

    def match(self, text: str) -> int:
        node, n = self.root, 0
        for ch in text:
            node = node.get(ch)  # type: ignore[assignment]
            if node is None:
                return n
            n += 1
        return n

    def insert(self, text: str) -> None:
        node = self.root
        for ch in text:
            node = node.setdefault(ch, {})


def _prompts(rng: random.Random, groups: int, per_group: int, length: int) -> list[str]:
    """`groups` shared prefixes of 90% of `length`, each followed by unique 10% suffixes, shuffled."""
    prefixes = [_text(rng, length * 9 // 10) for _ in range(groups)]
    prompts = [p + _text(rng, length - len(p)) for p in prefixes for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


def bench_choose(length: int, calls: int, repeats: int) -> tuple[float, float]:
    """Microseconds per choose + on_assigned on warm trees: radix (ours), then per-char dict trie."""
    rng = random.Random(length)
    warm = _prompts(rng, 16, 4, length)
    replicas = [Replica(f"http://r{i}:8000", last_assigned=i) for i in range(8)]
    policy = CacheAware(clock=time.monotonic)
    tries = {r.url: DictTrie() for r in replicas}
    for text in warm:
        chosen = policy.choose(replicas, len(text), text)
        policy.on_assigned(chosen, text)
        tries[chosen.url].insert(text)
    probes = _prompts(rng, 16, max(1, calls // 16), length)[:calls]

    def ours() -> None:
        for text in probes:
            policy.on_assigned(policy.choose(replicas, len(text), text), text)

    def dict_trie() -> None:
        for text in probes:
            best = max(replicas, key=lambda r: tries[r.url].match(text))
            tries[best.url].insert(text)

    return _timed(ours, len(probes), repeats), _timed(dict_trie, len(probes), max(1, repeats // 2))


def bench_pool(length: int, calls: int, repeats: int) -> float:
    """Microseconds per Pool.acquire + Lease.release with cache_aware (the router's whole path)."""
    rng = random.Random(length + 1)
    pool = Pool("bench", [f"http://r{i}:8000" for i in range(8)], policy=CacheAware())
    prompts = _prompts(rng, 16, max(1, calls // 16), length)[:calls]
    for text in prompts:
        pool.acquire(len(text), text=text).release(True)  # type: ignore[union-attr]

    def run() -> None:
        for text in prompts:
            pool.acquire(len(text), text=text).release(True)  # type: ignore[union-attr]

    return _timed(run, len(prompts), repeats)


def _timed(fn: Callable[[], None], calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1000)
    return statistics.median(samples)


def hit_rate(policy: Policy | None, prompts: list[str], group_of: dict[str, int], replicas: int) -> float:
    """Chars of each prompt already sent to its replica / all chars; requests released in turn.
    policy None: the best placement, each group always on one replica."""
    pool = Pool("bench", [f"http://r{i}:8000" for i in range(replicas)],
                policy=policy or RoundRobin(), clock=lambda: 0.0)
    seen = {r.url: PrefixTree() for r in pool.replicas}
    matched = 0
    for text in prompts:
        if policy is None:
            url = pool.replicas[group_of[text] % replicas].url
        else:
            lease = pool.acquire(len(text), text=text)
            assert isinstance(lease, Lease)
            url = lease.replica.url
            lease.release(True)
        matched += seen[url].match(text)
        seen[url].insert(text, 0.0)
    return matched / sum(map(len, prompts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()

    print("cache_aware choose + insert, 8 replicas, warm trees (16 groups x 4 prompts), median us/call")
    for length in (2_000, 20_000):
        ours, naive = bench_choose(length, args.calls, args.repeats)
        pool = bench_pool(length, args.calls, args.repeats)
        print(f"  {length:>6} chars: radix tree {ours:8.1f} us   per-char dict trie {naive:9.1f} us   "
              f"({naive / ours:5.1f}x)   Pool.acquire+release {pool:8.1f} us")

    rng = random.Random(8)
    prefixes = [_text(rng, 2000) for _ in range(32)]
    group_of = {p + _text(rng, 200): g for g, p in enumerate(prefixes) for _ in range(8)}
    prompts = list(group_of)
    rng.shuffle(prompts)
    print("shared-prefix workload: 32 groups x 8 prompts (2,000-char prefix + 200 unique), 4 replicas, "
          "hit rate = matched chars / all chars")
    for name, policy in (("cache_aware", CacheAware(clock=lambda: 0.0)), ("round_robin", RoundRobin()),
                         ("least_outstanding", LeastOutstanding()), ("best (group -> one replica)", None)):
        print(f"  {name:<28} {hit_rate(policy, prompts, group_of, 4):6.3f}")


if __name__ == "__main__":
    main()
