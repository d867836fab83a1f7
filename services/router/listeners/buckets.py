"""Rate limits' budgets as GCRA clocks (router process): a budget (a tenant's or a user's requests or tokens
per minute) is one number, the time its spending has reached; a cost moves it on by cost x 60 s / limit from
max(clock, now), and fits while the clock stays within a minute of now. Kept per router (LocalBuckets,
bounded in memory), or in the store for every router on it (SharedBuckets)."""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from services.router.plugins.store.base import Store, StoreUnavailable

log = logging.getLogger("router")

WINDOW_S = 60.0  # limits are per minute: a full budget is a minute's worth, spendable at once
# Names kept at most here (a tenant's or user's budget each): a flood of user names evicts the least recently
# used, whose budget then starts full again. ~100 bytes a name.
MAX_NAMES = 100_000

Clocks = Sequence[tuple[str, float]]  # (a budget's name, seconds to move its clock by: < 0 gives back)


class StoreDown(RuntimeError):
    """Shared limits could not be counted: the store did not answer and admission.on_store_error is closed."""


class LocalBuckets:
    """This router's clocks, least recently used first. A clock not ahead of now holds nothing (a full
    budget, as an unknown name has): those at the front are dropped as they are met, and past `max_names`
    the least recently used go too, so idle names never pile up."""

    __slots__ = ("_clocks", "max_names")

    def __init__(self, max_names: int = MAX_NAMES) -> None:
        self._clocks: OrderedDict[str, float] = OrderedDict()
        self.max_names = max_names

    def __len__(self) -> int:
        return len(self._clocks)

    def advance(self, clocks: Clocks, now: float) -> list[float]:
        """As Store.advance: max(clock, now) + cost for a cost of 0 or more, clock + cost for a refund."""
        mine = self._clocks
        out = []
        for name, cost in clocks:
            at = mine.pop(name, now)  # popped and put back: now the most recently used
            at = max(at, now) + cost if cost >= 0 else at + cost
            mine[name] = at
            out.append(at)
        while mine:
            name, at = next(iter(mine.items()))
            if at > now and len(mine) <= self.max_names:
                break
            del mine[name]
        return out


class SharedBuckets:
    """The store's clocks, shared by every router on it. While the store does not answer (within its
    timeout_s), admission.on_store_error decides: open counts here instead (LocalBuckets: each router its own
    budget meanwhile), closed raises StoreDown (a 503). An outage is logged once as it starts and once as it
    ends; every failed call is counted (`failed`)."""

    def __init__(self, store: Store, on_error: str, failed: Callable[[], None],
                 local: LocalBuckets | None = None) -> None:
        self.store = store
        self.open = on_error == "open"
        self.failed = failed
        self.local = local if local is not None else LocalBuckets()
        self._down = False

    async def advance(self, clocks: Clocks, now: float) -> tuple[list[float], bool]:
        """The clocks moved on, and whether in the store (False: here, the store being down)."""
        try:
            out = await self.store.advance(clocks, now)
        except StoreUnavailable as exc:
            self._failure(exc)
            if not self.open:
                raise StoreDown(str(exc)) from None
            return self.local.advance(clocks, now), False
        if self._down:
            self._down = False
            log.warning("shared rate limits: the store answers again; counted in it from now on")
        return out, True

    async def give_back(self, clocks: Clocks, now: float) -> None:
        """A settled request's correction, in the store (lost, and counted, if it does not answer)."""
        try:
            await self.store.advance(clocks, now)
        except StoreUnavailable as exc:
            self._failure(exc)

    def _failure(self, exc: StoreUnavailable) -> None:
        self.failed()
        if not self._down:
            self._down = True
            log.warning("shared rate limits: the store does not answer (%s); %s until it does", exc,
                        "each router counts its own" if self.open else "generating requests are refused (503)")
