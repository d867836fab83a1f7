"""The waiting line of a chat pool (router process): requests that found every ready replica at its cap
wait here, bounded, in service order: retries first, then a lower class's waiter past the starvation age,
then higher classes first and, within a class, tenants in turn (FIFO within a tenant). Order only: the
pool (pool.py) hands each freed slot to the first waiter this gives that can take it."""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from services.router.config.admission import AdmissionConfig

# Why a queued request was refused (router_queue_rejections' `reason`).
FULL, TTL, NO_ENDPOINT = "full", "ttl", "no_endpoint"


@dataclass(frozen=True, slots=True)
class Ticket:
    """Whose a request is and how long it may wait, as a pool's queue orders it (from listeners/caller.py's
    Caller and the config's classes)."""
    tenant: str
    priority: str  # the class's name
    rank: int  # 0: the highest class
    ttl_s: float  # the class's queue_ttl_s

    @classmethod
    def of(cls, admission: AdmissionConfig, tenant: str, priority: str) -> Ticket:
        rank = admission.rank(priority)
        return cls(tenant, priority, rank, admission.priorities[rank].queue_ttl_s)


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request: the pool's acquire arguments, and the future its slot (or refusal) is set on."""
    ticket: Ticket
    enqueued: float  # on the queue's clock
    future: asyncio.Future[Any]
    request_bytes: int = 0
    text: str | None = None
    exclude: frozenset[str] = frozenset()
    prepared: object = None
    retry: bool = False  # it had its turn and its replica failed: it goes first
    live: bool = field(default=True, repr=False)


@dataclass(slots=True)
class _Class:
    # Tenants in turn: the first is served next, and goes to the end once served.
    tenants: OrderedDict[str, deque[Waiter]] = field(default_factory=OrderedDict)
    arrivals: deque[Waiter] = field(default_factory=deque)  # every waiter in arrival order: the oldest first
    depth: int = 0


class FairQueue:
    def __init__(self, size: int, classes: tuple[str, ...], starvation_s: float,
                 clock: Callable[[], float]) -> None:
        """`size`: the most waiters (retries aside); `classes`: the priority classes' names, highest first."""
        if size < 1:
            raise ValueError(f"queue size must be >= 1, got {size}")
        self.size = size
        self.names = classes
        self.starvation_s = starvation_s
        self.clock = clock
        self._classes = [_Class() for _ in classes]
        self._retries: deque[Waiter] = deque()
        self.depth = 0  # waiters counted against `size`
        self.retrying = 0

    def __len__(self) -> int:
        return self.depth + self.retrying

    def full(self) -> bool:
        return self.depth >= self.size

    def depths(self) -> dict[str, int]:
        """Waiters per class, retries included (the depth gauge)."""
        out = {name: c.depth for name, c in zip(self.names, self._classes, strict=True)}
        for w in self._retries:
            if w.live:
                out[w.ticket.priority] += 1
        return out

    def add(self, waiter: Waiter) -> None:
        """Queued at the end of its tenant's line (a retry: at the end of the retries' line). A retry is not
        counted against `size`: it held a slot already, so there are at most as many as slots."""
        if waiter.retry:
            self._retries.append(waiter)
            self.retrying += 1
            return
        assert not self.full(), "add after full() said there is room"
        c = self._classes[waiter.ticket.rank]
        line = c.tenants.get(waiter.ticket.tenant)
        if line is None:
            line = c.tenants[waiter.ticket.tenant] = deque()
        line.append(waiter)
        c.arrivals.append(waiter)
        c.depth += 1
        self.depth += 1

    def remove(self, waiter: Waiter) -> None:
        """Out of the line (served, refused, its TTL passed, or its client left); again: no-op. Removal is
        lazy in the deques (dropped when they reach a head), so it costs O(1) whatever the line's length."""
        if not waiter.live:
            return
        waiter.live = False
        if waiter.retry:
            self.retrying -= 1
            _trim(self._retries)
            return
        c = self._classes[waiter.ticket.rank]
        c.depth -= 1
        self.depth -= 1
        line = c.tenants[waiter.ticket.tenant]
        _trim(line)
        if not line:
            del c.tenants[waiter.ticket.tenant]
        _trim(c.arrivals)

    def served(self, waiter: Waiter) -> None:
        """Removed, and its tenant's turn over: it goes to the end of its class's round."""
        self.remove(waiter)
        if not waiter.retry:
            tenants = self._classes[waiter.ticket.rank].tenants
            if waiter.ticket.tenant in tenants:
                tenants.move_to_end(waiter.ticket.tenant)

    def order(self) -> Iterator[Waiter]:
        """The live waiters in service order. Stop iterating once the queue changed (add, remove, served)."""
        yield from (w for w in self._retries if w.live)
        top = next((i for i, c in enumerate(self._classes) if c.depth), None)
        if top is None:
            return
        # The guard: below the highest class waiting, a waiter that has waited starvation_s goes first,
        # the oldest first. It is its tenant's oldest (FIFO per tenant), so each tenant's order holds.
        now = self.clock()
        starving = sorted((c.arrivals[0] for c in self._classes[top + 1:] if c.depth
                           and now - c.arrivals[0].enqueued >= self.starvation_s), key=lambda w: w.enqueued)
        yield from starving
        for c in self._classes[top:]:
            # Rounds: each tenant's first waiter in turn, then each one's second, and so on.
            lines = [iter(line) for line in c.tenants.values()]
            while lines:
                left = []
                for line in lines:
                    w = next((w for w in line if w.live), None)
                    if w is not None:
                        if w not in starving:
                            yield w
                        left.append(line)
                lines = left


def _trim(line: deque[Waiter]) -> None:
    while line and not line[0].live:
        line.popleft()
