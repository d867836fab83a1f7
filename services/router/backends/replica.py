"""One replica's state as the router process sees it: load, health and its circuit breaker.

Plain data with no imports of its own, so both the pools (pool.py) and the policies that choose
among replicas can depend on it without depending on each other.
"""
from __future__ import annotations

from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(slots=True, eq=False)
class Replica:
    url: str
    outstanding_bytes: int = 0  # request bytes sent and not yet finished
    inflight: int = 0
    last_assigned: float = 0.0  # pool-wide sequence number of its latest lease; 0: never
    healthy: bool = True  # the latest active check passed, or there was none yet
    health_detail: str = ""
    breaker: str = CLOSED  # OPEN turns HALF_OPEN lazily, when the pool next looks at it
    request_failures: int = 0  # consecutive
    health_failures: int = 0  # consecutive
    opened_at: float = 0.0
    # Since it was last seen up, it was seen down: a failed health check, or a request that could not
    # connect. A passing check then means it came back (a restart), and closes an open breaker.
    seen_down: bool = False
    probe_inflight: bool = False
    key_refused: bool = False  # its latest answer refused the pool's api_key (401/403): logged once per change
