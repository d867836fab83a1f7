"""The admission settings of the router config (router process, read at start by admission_reader.py):
rate limits per tenant and per user, each API key's own settings (its tenant, priority class, limits),
and the priority classes whose requests wait in a pool's queue. Types and defaults only."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

ON_STORE_ERROR = ("open", "closed")  # shared limits with the store down: admit (counted locally) or 503
PRIORITY_HEADER = "x-router-priority"  # a key with `priority_header: true` may choose its request's class


@dataclass(frozen=True, slots=True)
class Limits:
    """Per minute; None: not limited."""
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # charged at admission from the prompt and max_tokens, corrected by usage

    def __bool__(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


NO_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class KeySettings:
    """One API key's admission settings (listeners[].keys[]); a key not listed there has the defaults."""
    name: str | None = None  # how metrics and logs call it (never the key itself); None: key-<digest>
    tenant: str | None = None  # keys of one tenant share its limits and its turn in the queue; None: its own
    priority: str | None = None  # its requests' class; None: admission.default_priority
    priority_header: bool = False  # may choose a class per request with the x-router-priority header
    limits: Limits | None = None  # its tenant's limits; None: the listener's `limits`
    user_limits: Limits | None = None  # each user's (within the tenant); None: the listener's `user_limits`


DEFAULT_KEY = KeySettings()


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    queue_ttl_s: float = 30.0  # the longest a request of this class waits in a pool's queue (then 429)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Router-wide admission (`admission:`). Classes are listed highest first."""
    priorities: tuple[PriorityClass, ...] = (PriorityClass("standard"),)
    default_priority: str = "standard"
    # A queued request that has waited this long is served before any class above it: the lowest are
    # never starved by a steady stream of higher ones.
    starvation_s: float = 10.0
    shared: bool = False  # limits counted in the store, shared by every router on it; False: per router
    on_store_error: str = "open"  # shared limits, store down: admit and count locally, or refuse (503)

    def rank(self, priority: str) -> int:
        """0 for the highest class."""
        return next(i for i, c in enumerate(self.priorities) if c.name == priority)


def key_label(key: str) -> str:
    """A key's name where it has none: short enough for a metric label, and not the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]
