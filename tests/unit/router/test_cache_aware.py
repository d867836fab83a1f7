from __future__ import annotations

import random

import pytest

from services.router.backends.policies import Policy
from services.router.backends.policies.cache_aware import CacheAware, PrefixTree
from services.router.backends.policies.round_robin import RoundRobin
from services.router.backends.pool import Lease, Pool
from services.router.backends.replica import Replica


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ,.", k=n))


def _route(policy: CacheAware, replicas: list[Replica], text: str) -> Replica:
    """What a Pool does around a policy, minus the lease."""
    chosen = policy.choose(replicas, len(text), text)
    policy.on_assigned(chosen, text)
    return chosen


def _replicas(n: int) -> list[Replica]:
    return [Replica(f"http://r{i}", last_assigned=i) for i in range(n)]


def test_repeated_prefix_returns_to_the_same_replica() -> None:
    rng = random.Random(1)
    policy, rs = CacheAware(clock=Clock()), _replicas(4)
    system = _text(rng, 1000)
    first = _route(policy, rs, system + "question one")
    for q in ("question two", "x", "twenty chars ending!"):
        assert _route(policy, rs, system + q) is first
    assert policy.last_reason == f"cache_aware: match 0.98 > 0.50 -> {first.url}"
    assert policy.last_match == pytest.approx(1000 / 1020)


def test_below_threshold_goes_to_the_smallest_tree() -> None:
    rng = random.Random(2)
    policy, rs = CacheAware(clock=Clock()), _replicas(3)
    big, small = _text(rng, 900), _text(rng, 300)
    assert _route(policy, rs, big) is rs[0]  # all empty: ties go to the least recently assigned
    rs[0].last_assigned = 10
    assert _route(policy, rs, small) is rs[1]
    rs[1].last_assigned = 11
    # Shares 400 of 1000 chars with r0 (0.4 <= 0.5): the empty tree, r2, takes it.
    assert _route(policy, rs, big[:400] + _text(rng, 600)) is rs[2]
    assert "best match 0.40 <= 0.50 -> smallest tree http://r2 (0 chars)" in policy.last_reason
    # r1 (300 chars) is now the smallest tree.
    assert _route(policy, rs, _text(rng, 50)) is rs[1]


def test_imbalance_falls_back_to_least_loaded() -> None:
    rng = random.Random(3)
    policy, rs = CacheAware(balance_abs=4, balance_rel=1.5, clock=Clock()), _replicas(3)
    prefix = _text(rng, 500)
    hot = _route(policy, rs, prefix + "1")
    others = [r for r in rs if r is not hot]
    hot.inflight, others[0].inflight, others[1].inflight = 6, 2, 3
    assert _route(policy, rs, prefix + "2") is hot  # 6 - 2 = 4 is not > 4: stay with the cache
    hot.inflight = 7
    assert _route(policy, rs, prefix + "3") is others[0]  # 7 - 2 > 4 and 7 > 1.5 x 2
    assert policy.last_reason == f"cache_aware: imbalanced (in-flight max 7, min 2) -> least loaded {others[0].url}"
    assert policy.cached_chars(others[0].url) == 501  # the request was still recorded where it went


def test_relative_threshold_also_has_to_hold() -> None:
    policy, rs = CacheAware(balance_abs=4, balance_rel=1.5, clock=Clock()), _replicas(2)
    hot = _route(policy, rs, "x" * 100)
    hot.inflight, rs[1].inflight = 20, 14  # 20 - 14 > 4 but 20 < 1.5 x 14
    assert _route(policy, rs, "x" * 101) is hot


def test_age_eviction_forgets_what_was_not_used_recently() -> None:
    rng = random.Random(4)
    clock = Clock()
    policy, rs = CacheAware(eviction_s=120, clock=clock), _replicas(2)
    old, kept = _text(rng, 400), _text(rng, 400)
    r_old = _route(policy, rs, old)
    rs[0].last_assigned = 5
    assert _route(policy, rs, kept) is not r_old
    clock.t = 100
    r_kept = _route(policy, rs, kept + "again")  # refreshes `kept`, not `old`
    clock.t = 121
    policy.choose(rs, 1, "anything")
    assert policy.cached_chars(r_old.url) == 0
    assert policy.cached_chars(r_kept.url) == 405
    clock.t = 221
    policy.choose(rs, 1, "anything")
    assert policy.cached_chars(r_kept.url) == 0


def test_size_eviction_drops_least_recently_used_leaves_first() -> None:
    rng = random.Random(5)
    tree = PrefixTree(max_chars=1000)
    shared, a, b, c = _text(rng, 200), _text(rng, 300), _text(rng, 300), _text(rng, 300)
    tree.insert(shared + a, 1.0)
    tree.insert(shared + b, 2.0)
    tree.insert(shared + a, 3.0)  # a is now more recent than b
    assert tree.size == 800
    tree.insert(shared + c, 4.0)  # 1100 > 1000: b's leaf goes
    assert tree.size == 800
    assert tree.match(shared + b) == 200
    assert tree.match(shared + a) == 500 and tree.match(shared + c) == 500


def test_a_policy_tree_is_capped_by_max_tree_chars() -> None:
    rng = random.Random(6)
    policy, rs = CacheAware(max_tree_chars=5000, clock=Clock()), _replicas(1)
    for _ in range(40):
        _route(policy, rs, _text(rng, 1000))
    assert 4000 <= policy.cached_chars(rs[0].url) <= 5000


def test_prefix_tree_matches_a_brute_force_model() -> None:
    rng = random.Random(7)
    tree, inserted = PrefixTree(), []
    stems = [_text(rng, rng.randint(1, 40)) for _ in range(6)]
    for step in range(400):
        text = rng.choice(stems)[: rng.randint(0, 40)] + "ab"[: rng.randint(0, 2)] + _text(rng, rng.randint(0, 5))
        probe = rng.choice(stems) + _text(rng, 3)
        want = max((_lcp(probe, s) for s in inserted), default=0)
        assert tree.match(probe) == want, step
        tree.insert(text, float(step))
        inserted.append(text)
    prefixes = {s[:k] for s in inserted for k in range(1, len(s) + 1)}
    assert tree.size == len(prefixes)  # one stored char per distinct non-empty prefix


def _lcp(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_removed_replica_loses_its_tree() -> None:
    policy, rs = CacheAware(clock=Clock()), _replicas(1)
    _route(policy, rs, "hello world")
    policy.on_removed(rs[0].url)
    assert policy.cached_chars(rs[0].url) == 0


def test_no_text_goes_to_least_loaded() -> None:
    policy, rs = CacheAware(clock=Clock()), _replicas(2)
    rs[0].inflight = 1
    assert policy.choose(rs, 10, None) is rs[1]
    assert policy.last_reason == "cache_aware: no text -> least loaded http://r1"


def _shared_prefix_hit_rate(policy: Policy) -> float:
    """32 groups x 8 prompts sharing a 2,000-char prefix, shuffled, over 4 replicas; each request is
    released before the next. Hit rate = chars of each prompt already sent to its replica / all chars."""
    rng = random.Random(8)
    prefixes = [_text(rng, 2000) for _ in range(32)]
    prompts = [p + _text(rng, 200) for p in prefixes for _ in range(8)]
    rng.shuffle(prompts)
    pool = Pool("p", [f"http://r{i}" for i in range(4)], policy=policy, clock=lambda: 0.0)
    seen = {r.url: PrefixTree() for r in pool.replicas}
    matched = 0
    for text in prompts:
        lease = pool.acquire(len(text), text=text)
        assert isinstance(lease, Lease)
        matched += seen[lease.replica.url].match(text)
        seen[lease.replica.url].insert(text, 0.0)
        lease.release(True)
    return matched / sum(map(len, prompts))


def test_shared_prefix_workload_hit_rate_beats_round_robin() -> None:
    best = 7 / 8 * 2000 / 2200  # each group's first prompt misses, the other 7 hit the prefix
    cache_aware = _shared_prefix_hit_rate(CacheAware(clock=lambda: 0.0))
    round_robin = _shared_prefix_hit_rate(RoundRobin())
    assert cache_aware >= 0.98 * best
    assert round_robin < 0.7 * best


@pytest.mark.parametrize("kw", [{"cache_threshold": 1.5}, {"balance_rel": 0.5}, {"max_tree_chars": 0},
                                {"eviction_s": 0}, {"balance_abs": -1}])
def test_settings_are_validated(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        CacheAware(**kw)  # type: ignore[arg-type]
