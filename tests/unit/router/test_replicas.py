from __future__ import annotations

import pytest

from services.router.backends.pool import Lease, NoReplica, Overloaded, Pool
from services.router.backends.replica import CLOSED, HALF_OPEN, OPEN


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pool(n: int = 3, **kw: object) -> tuple[Pool, Clock]:
    clock = Clock()
    return Pool("chat", [f"http://r{i}" for i in range(n)], clock=clock, **kw), clock  # type: ignore[arg-type]


def _lease(pool: Pool, request_bytes: int = 10, **kw: object) -> Lease:
    got = pool.acquire(request_bytes, **kw)  # type: ignore[arg-type]
    assert isinstance(got, Lease), got
    return got


def test_fewest_outstanding_bytes_wins() -> None:
    pool, _ = _pool()
    big = _lease(pool, 5000)
    small = _lease(pool, 100)
    assert (big.replica.url, small.replica.url) == ("http://r0", "http://r1")
    # Bytes, not request counts: r2 takes a second request while it holds fewer bytes than r1.
    assert _lease(pool, 60).replica.url == "http://r2"
    assert _lease(pool, 60).replica.url == "http://r2"
    assert _lease(pool, 1).replica.url == "http://r1"  # 100 bytes < r2's 120 < r0's 5000
    assert (small.replica.outstanding_bytes, small.replica.inflight) == (101, 2)
    assert (big.replica.outstanding_bytes, big.replica.inflight) == (5000, 1)


def test_ties_go_to_least_recently_assigned() -> None:
    pool, _ = _pool()
    order = []
    for _ in range(6):
        lease = _lease(pool, 10)
        order.append(lease.replica.url)
        lease.release(True)  # every replica back to 0 bytes: a tie each time
    assert order == ["http://r0", "http://r1", "http://r2"] * 2
    assert "tie of 3" in pool.policy.last_reason


def test_overloaded_when_every_ready_replica_is_at_the_cap() -> None:
    pool, _ = _pool(2, max_inflight=2, retry_after_s=3)
    leases = [_lease(pool) for _ in range(4)]
    got = pool.acquire(10)
    assert isinstance(got, Overloaded) and got.retry_after_s == 3
    leases[0].release(True)  # one slot frees up
    assert _lease(pool).replica is leases[0].replica


def test_a_full_replica_is_skipped_when_another_has_room() -> None:
    pool, _ = _pool(2, max_inflight=1)
    first = _lease(pool, 1)
    # r1 now holds far more bytes than r0 would, but r0 is at the cap.
    second = _lease(pool, 10**9)
    assert second.replica is not first.replica
    assert isinstance(pool.acquire(1), Overloaded)


def test_no_replica_reason_names_each_replica_state() -> None:
    pool, _ = _pool(3, failures=1, cooldown_s=10)
    pool.record_health(pool.replicas[0], False, detail="connect refused")
    pool.record_failure(pool.replicas[1])
    got = pool.acquire(1, exclude=frozenset({"http://r2"}))
    assert isinstance(got, NoReplica)
    assert "http://r0: unhealthy (connect refused)" in got.reason
    assert "http://r1: breaker open after 1 consecutive failures, half-open in 10.0s" in got.reason
    assert "http://r2: excluded" in got.reason
    assert "no replicas" in Pool("empty", []).acquire(1).reason  # type: ignore[union-attr]


def test_exclude_retries_on_another_replica() -> None:
    pool, _ = _pool(2)
    first = _lease(pool)
    first.release(False)
    retry = _lease(pool, exclude=frozenset({first.replica.url}))
    assert retry.replica is not first.replica
    retry.release(True)
    assert isinstance(pool.acquire(1, exclude=frozenset({"http://r0", "http://r1"})), NoReplica)


def test_release_is_idempotent() -> None:
    pool, _ = _pool(1, failures=2)
    keep = _lease(pool, 7)
    lease = _lease(pool, 100)
    lease.release(False)
    lease.release(False)
    r = lease.replica
    assert (r.inflight, r.outstanding_bytes) == (1, 7)
    assert r.request_failures == 1 and r.breaker == CLOSED  # a second failure would have opened it
    keep.release(True)
    assert (r.inflight, r.outstanding_bytes) == (0, 0)


def test_breaker_opens_after_n_consecutive_failures() -> None:
    pool, _ = _pool(1, failures=3)
    r = pool.replicas[0]
    for _ in range(2):
        _lease(pool).release(False)
    _lease(pool).release(True)  # a success breaks the run
    for _ in range(2):
        _lease(pool).release(False)
    assert r.breaker == CLOSED and pool.is_ready(r)
    _lease(pool).release(False)
    assert r.breaker == OPEN and not pool.is_ready(r)
    assert isinstance(pool.acquire(1), NoReplica)


def test_half_open_allows_exactly_one_probe_then_closes_on_success() -> None:
    pool, clock = _pool(1, failures=1, cooldown_s=30)
    r = pool.replicas[0]
    _lease(pool).release(False)
    clock.t += 29.9
    assert isinstance(pool.acquire(1), NoReplica)
    clock.t += 0.1
    probe = _lease(pool)
    assert pool.snapshot()[0]["breaker"] == HALF_OPEN
    assert isinstance(pool.acquire(1), Overloaded)  # the probe is the only request let through
    probe.release(True)
    assert r.breaker == CLOSED
    assert isinstance(pool.acquire(1), Lease) and isinstance(pool.acquire(1), Lease)


def test_failed_probe_reopens_the_breaker() -> None:
    pool, clock = _pool(1, failures=1, cooldown_s=30)
    r = pool.replicas[0]
    _lease(pool).release(False)
    clock.t += 30
    _lease(pool).release(False)
    assert r.breaker == OPEN
    clock.t += 29
    assert isinstance(pool.acquire(1), NoReplica)  # the cooldown restarted at the failed probe
    clock.t += 1
    assert isinstance(pool.acquire(1), Lease)


def test_failed_health_check_makes_a_replica_not_ready() -> None:
    pool, _ = _pool(2, failures=3)
    r0 = pool.replicas[0]
    pool.record_health(r0, False)
    assert not pool.is_ready(r0) and r0.breaker == CLOSED
    assert all(_lease(pool).replica.url == "http://r1" for _ in range(3))
    pool.record_health(r0, True)
    assert pool.is_ready(r0)
    assert _lease(pool).replica is r0


def test_failed_checks_never_open_the_breaker_and_one_pass_lets_a_starting_replica_serve() -> None:
    """A replica starting up (a frontend whose engines load for a minute) fails its checks until it
    is ready; the first pass must let it serve at once, not after a cool-down and a probe."""
    pool, clock = _pool(1, failures=2, cooldown_s=5)
    r = pool.replicas[0]
    for _ in range(5):
        pool.record_health(r, False)
        clock.t += 2
    assert r.breaker == CLOSED and not pool.is_ready(r)
    pool.record_health(r, True)
    assert r.breaker == CLOSED and pool.is_ready(r)


def test_a_replica_back_from_being_down_serves_at_its_first_passing_check() -> None:
    """Killed under load: requests could not connect and opened the breaker. Restarted, it passes a
    check well within the cool-down; it must serve at once (Envoy un-ejects on a passing active check)."""
    pool, clock = _pool(1, failures=2, cooldown_s=10)
    r = pool.replicas[0]
    _lease(pool).release(False, unreachable=True)
    _lease(pool).release(False, unreachable=True)
    assert r.breaker == OPEN and not pool.is_ready(r)
    clock.t += 1.8
    sent = pool.now()
    clock.t += 0.01
    pool.record_health(r, True, sent_at=sent)
    assert r.breaker == CLOSED and pool.is_ready(r) and r.request_failures == 0
    assert isinstance(pool.acquire(1), Lease) and isinstance(pool.acquire(1), Lease)  # closed, not a probe


def test_a_failed_check_then_a_passing_one_closes_a_breaker_requests_opened() -> None:
    pool, clock = _pool(1, failures=2, cooldown_s=10)
    r = pool.replicas[0]
    _lease(pool).release(False)
    _lease(pool).release(False)  # 5xx heads: the process answered
    assert r.breaker == OPEN
    clock.t += 1
    pool.record_health(r, False, detail="connect refused")  # then it went down (a restart)
    clock.t += 1
    pool.record_health(r, True)
    assert r.breaker == CLOSED and pool.is_ready(r)


def test_a_replica_whose_checks_pass_while_its_requests_fail_waits_for_the_cool_down_and_a_probe() -> None:
    pool, clock = _pool(1, failures=2, cooldown_s=5)
    r = pool.replicas[0]
    _lease(pool).release(False)
    _lease(pool).release(False)  # requests failed: /health answering proves nothing about them
    assert r.breaker == OPEN
    clock.t += 1
    pool.record_health(r, True)
    assert r.breaker == OPEN and not pool.is_ready(r)
    clock.t += 4
    probe = _lease(pool)
    assert probe.probe and isinstance(pool.acquire(1), Overloaded)
    probe.release(True)
    assert r.breaker == CLOSED


def test_a_passing_check_sent_before_the_breaker_opened_does_not_close_it() -> None:
    """It may have been answered just before the replica died."""
    pool, clock = _pool(1, failures=1, cooldown_s=10)
    r = pool.replicas[0]
    sent = pool.now()
    clock.t += 0.1
    _lease(pool).release(False, unreachable=True)
    clock.t += 0.1
    pool.record_health(r, True, sent_at=sent)
    assert r.breaker == OPEN and not pool.is_ready(r)


def test_a_failing_check_while_half_open_does_not_restart_the_cool_down() -> None:
    pool, clock = _pool(1, failures=1, cooldown_s=10, unhealthy_after=2)
    r = pool.replicas[0]
    _lease(pool).release(False)
    clock.t += 10
    assert pool.snapshot()[0]["breaker"] == HALF_OPEN
    opened = r.opened_at
    pool.record_health(r, False, detail="timed out")  # one slow check: still ready for the probe
    assert r.breaker == HALF_OPEN and r.opened_at == opened and pool.is_ready(r)
    pool.record_health(r, False, detail="timed out")  # out now, but the breaker's clock is untouched
    assert not pool.is_ready(r) and r.breaker == HALF_OPEN and r.opened_at == opened
    pool.record_health(r, True)  # seen down, now answering: closed
    assert r.breaker == CLOSED and pool.is_ready(r)


def test_replace_replicas_keeps_state_of_urls_that_stay() -> None:
    pool, _ = _pool(2, failures=1)
    lease = _lease(pool, 50)
    pool.record_failure(pool.replicas[1])
    pool.replace_replicas(["http://r1", "http://r0", "http://r9", "http://r0"])
    assert [r.url for r in pool.replicas] == ["http://r1", "http://r0", "http://r9"]
    assert pool.replicas[1] is lease.replica and lease.replica.outstanding_bytes == 50
    assert pool.replicas[0].breaker == OPEN
    pool.replace_replicas(["http://r9"])
    lease.release(True)  # a lease on a removed replica still releases cleanly
    assert [s["url"] for s in pool.snapshot()] == ["http://r9"]


def test_snapshot() -> None:
    pool, _ = _pool(2)
    _lease(pool, 12)
    pool.record_health(pool.replicas[1], False)
    assert pool.snapshot() == [
        {"url": "http://r0", "ready": True, "healthy": True, "breaker": "closed", "inflight": 1,
         "outstanding_bytes": 12, "consecutive_failures": 0},
        {"url": "http://r1", "ready": False, "healthy": False, "breaker": "closed", "inflight": 0,
         "outstanding_bytes": 0, "consecutive_failures": 1},
    ]


def test_preview_counts_nothing() -> None:
    pool, _ = _pool(2)
    picked = pool.preview(10)
    assert picked is pool.replicas[0] and picked.inflight == 0
    assert _lease(pool).replica is picked


@pytest.mark.parametrize("key, value", [("max_inflight", 0), ("failures", 0), ("cooldown_s", -1.0)])
def test_settings_are_validated(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=key):
        Pool("chat", ["http://r0"], **{key: value})  # type: ignore[arg-type]


def test_an_abandoned_probe_lets_the_next_request_probe() -> None:
    pool, clock = _pool(1, failures=1, cooldown_s=30)
    r = pool.replicas[0]
    _lease(pool).release(False)
    clock.t += 30
    probe = _lease(pool)
    assert probe.probe
    probe.release(None)  # the client left: nothing learned about the replica
    assert r.breaker == HALF_OPEN and r.request_failures == 1
    again = _lease(pool)
    assert again.probe
    again.succeeded()  # the response head is enough to close it
    assert r.breaker == CLOSED
    again.release(True)


def test_requests_from_before_the_breaker_opened_do_not_move_it() -> None:
    pool, clock = _pool(1, failures=2, cooldown_s=30, max_inflight=8)
    r = pool.replicas[0]
    old_ok, old_bad = _lease(pool), _lease(pool)
    _lease(pool).release(False)
    _lease(pool).release(False)
    assert r.breaker == OPEN
    clock.t += 30
    probe = _lease(pool)
    old_ok.release(True)  # not the probe: the breaker stays half-open, one probe at a time
    assert r.breaker == HALF_OPEN and isinstance(pool.acquire(1), Overloaded)
    old_bad.release(False)  # nor does a late failure reopen it under the running probe
    assert r.breaker == HALF_OPEN and r.probe_inflight
    probe.release(True)
    assert r.breaker == CLOSED


def test_abandoned_requests_do_not_reset_the_failure_count() -> None:
    pool, _ = _pool(1, failures=3)
    r = pool.replicas[0]
    _lease(pool).release(False)
    _lease(pool).release(False)
    _lease(pool).release(None)
    assert r.request_failures == 2
    _lease(pool).release(False)
    assert r.breaker == OPEN


def test_unhealthy_after_consecutive_failed_checks() -> None:
    pool, _ = _pool(2, unhealthy_after=2, failures=5)
    r0 = pool.replicas[0]
    pool.record_health(r0, False, detail="timed out")
    assert pool.is_ready(r0)  # one slow check under load does not take it out
    pool.record_health(r0, False, detail="timed out")
    assert not pool.is_ready(r0) and pool.snapshot()[0]["healthy"] is False
    pool.record_health(r0, True)
    assert pool.is_ready(r0)


def test_a_replica_that_leaves_and_returns_keeps_its_running_requests() -> None:
    pool, _ = _pool(2, max_inflight=1)
    running = _lease(pool)
    url = running.replica.url
    pool.replace_replicas([r.url for r in pool.replicas if r.url != url])
    pool.replace_replicas(["http://r0", "http://r1"])  # DNS flapped back
    back = pool.get(url)
    assert back is running.replica and back.inflight == 1  # still at its cap of 1
    running.release(True)
    pool.replace_replicas(["http://r9"])
    pool.replace_replicas(["http://r0", "http://r1"])
    assert pool.get(url) is not running.replica  # nothing ran any more: a fresh start


def test_a_stale_abandoned_probe_does_not_free_a_newer_probes_slot() -> None:
    pool, clock = _pool(1, failures=1, cooldown_s=30, max_inflight=8)
    r = pool.replicas[0]
    _lease(pool).release(False)
    clock.t += 30
    first = _lease(pool)
    first.failed()  # the probe's head was a 5xx: open again...
    clock.t += 30
    second = _lease(pool)  # ...and half-open again, with a new probe
    assert second.probe and r.probe_inflight
    first.release(None)  # the old probe's client leaves late
    assert r.probe_inflight and isinstance(pool.acquire(1), Overloaded)  # still one probe at a time
    second.release(True)
    assert r.breaker == CLOSED
