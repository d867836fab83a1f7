"""Replica-choice policies of the router process: one module per policy behind the `Policy` interface,
and the factory that builds a pool's policy from its config by name.

A Pool filters its replicas (ready, below the in-flight cap, not excluded) and asks its policy to pick.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from services.router.backends.policies.cache_aware import CacheAware
from services.router.backends.policies.least_outstanding import LeastOutstanding
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.policies.round_robin import RoundRobin
from services.router.backends.replica import Replica
from services.router.config import PoolConfig


class Policy(Protocol):
    """`choose` may be called without the request being sent (a /v1/router/explain preview), so it must
    not remember the request; the Pool calls `on_assigned` only when it hands out a lease."""

    last_reason: str
    """One line on the latest choice, e.g. "cache_aware: match 0.83 > 0.50 -> http://a:8000"."""

    reads_body: bool
    """Whether `prepare` reads the body's messages or prompt (a long body's are decoded for it only then)."""

    async def prepare(self, body: dict[str, Any], size: int) -> object:
        """Once per request and pool, before any choice: work the choice needs that may take a while
        (precise_prefix tokenizes `body`, the chat or completions body of `size` bytes). What it
        returns comes back to `choose` as `prepared`; None for the policies that need nothing."""
        ...

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None,
               prepared: object = None) -> Replica:
        """Pick one of `candidates` (ready, below the cap, non-empty)."""
        ...

    def on_assigned(self, replica: Replica, text: str | None, prepared: object = None) -> None:
        """The request went to `replica` (`prepared`: what `prepare` made of it)."""
        ...

    def on_removed(self, url: str) -> None:
        """The replica left the pool (DNS refresh): forget what is known about it."""
        ...


def _cache_aware(config: PoolConfig) -> Policy:
    c = config.cache_aware
    return CacheAware(cache_threshold=c.cache_threshold, balance_abs=c.balance_abs, balance_rel=c.balance_rel,
                      max_tree_chars=c.max_tree_chars, eviction_s=c.eviction_s)


def _precise_prefix(config: PoolConfig) -> Policy:
    c = config.precise_prefix
    return PrecisePrefix(cache_threshold=c.cache_threshold, balance_abs=c.balance_abs, balance_rel=c.balance_rel,
                         pending_s=c.pending_s)


# Keyed by the names a pool's `policy` accepts (config POLICIES).
_FACTORIES: dict[str, Callable[[PoolConfig], Policy]] = {
    "least_outstanding": lambda config: LeastOutstanding(),
    "cache_aware": _cache_aware,
    "round_robin": lambda config: RoundRobin(),
    "precise_prefix": _precise_prefix,
}


def build_policy(config: PoolConfig) -> Policy:
    """A new policy for the pool `config` describes (each pool has its own: policies keep state)."""
    factory = _FACTORIES.get(config.policy)
    if factory is None:
        raise ValueError(f"pool {config.name!r}: unknown policy {config.policy!r}; one of {', '.join(_FACTORIES)}")
    return factory(config)
