"""The load fallbacks the prefix policies share (cache_aware, precise_prefix), as sgl-router's."""
from __future__ import annotations

from services.router.backends.replica import Replica


def least_loaded(r: Replica) -> tuple[int, int, float]:
    """Sort key: fewest in-flight requests, then outstanding bytes, then least recently assigned."""
    return r.inflight, r.outstanding_bytes, r.last_assigned


def imbalance(candidates: list[Replica], balance_abs: int, balance_rel: float) -> tuple[int, int] | None:
    """(max, min) in-flight counts when they are imbalanced (max - min > balance_abs and max >
    balance_rel x min): then load, not the cache, decides. None otherwise."""
    loads = [r.inflight for r in candidates]
    high, low = max(loads), min(loads)
    return (high, low) if high - low > balance_abs and high > balance_rel * low else None
