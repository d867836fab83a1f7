from __future__ import annotations

from services.router.backends.policies.round_robin import RoundRobin
from services.router.backends.pool import Lease, Pool


def test_rotates_regardless_of_load() -> None:
    pool = Pool("p", ["http://a", "http://b", "http://c"], policy=RoundRobin(), clock=lambda: 0.0)
    urls = []
    for size in (10**6, 1, 1, 1, 1, 1):
        lease = pool.acquire(size)
        assert isinstance(lease, Lease)
        urls.append(lease.replica.url)  # leases stay open: load differs, the rotation does not
    assert urls == ["http://a", "http://b", "http://c"] * 2
    assert pool.policy.last_reason == "round_robin: least recently assigned -> http://c"


def test_skips_a_replica_that_left_the_candidates() -> None:
    pool = Pool("p", ["http://a", "http://b", "http://c"], policy=RoundRobin(), clock=lambda: 0.0)
    pool.record_health(pool.replicas[1], False)
    urls = [pool.acquire(1).replica.url for _ in range(4)]  # type: ignore[union-attr]
    assert urls == ["http://a", "http://c", "http://a", "http://c"]
    pool.record_health(pool.replicas[1], True)
    assert pool.acquire(1).replica.url == "http://b"  # type: ignore[union-attr]
