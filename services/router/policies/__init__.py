"""Replica-choice policies of the router process: one module per policy behind the `Policy` interface.

A Pool filters its replicas (ready, below the in-flight cap, not excluded) and asks its policy to pick.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from services.router.replicas import Replica


class Policy(Protocol):
    """`choose` may be called without the request being sent (a /v1/decisions preview), so it must
    not remember the request; the Pool calls `on_assigned` only when it hands out a lease."""

    last_reason: str
    """One line on the latest choice, e.g. "cache_aware: match 0.83 > 0.50 -> http://a:8000"."""

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None) -> Replica:
        """Pick one of `candidates` (ready, below the cap, non-empty)."""
        ...

    def on_assigned(self, replica: Replica, text: str | None) -> None:
        """The request went to `replica`."""
        ...

    def on_removed(self, url: str) -> None:
        """The replica left the pool (DNS refresh): forget what is known about it."""
        ...
