from __future__ import annotations

from services.router.backends.policies.least_outstanding import LeastOutstanding
from services.router.backends.replica import Replica


def _replicas(*loads: tuple[int, float]) -> list[Replica]:
    return [Replica(f"http://r{i}", outstanding_bytes=b, last_assigned=t) for i, (b, t) in enumerate(loads)]


def test_fewest_outstanding_bytes() -> None:
    rs = _replicas((300, 1), (20, 2), (4000, 3))
    policy = LeastOutstanding()
    assert policy.choose(rs, 10, None) is rs[1]
    assert policy.last_reason == "least_outstanding: 20 outstanding bytes -> http://r1"


def test_bytes_beat_request_counts() -> None:
    rs = _replicas((10_000, 1), (100, 2))
    rs[0].inflight, rs[1].inflight = 1, 5
    assert LeastOutstanding().choose(rs, 10, None) is rs[1]


def test_tie_goes_to_least_recently_assigned() -> None:
    rs = _replicas((50, 7), (50, 3), (50, 9), (60, 1))
    policy = LeastOutstanding()
    assert policy.choose(rs, 10, None) is rs[1]
    assert "tie of 3, least recently assigned" in policy.last_reason
