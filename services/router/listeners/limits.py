"""Rate limits of the router process: requests and tokens per minute per tenant, and per user within it (a
listener's `limits` and `user_limits`, or its key's own), charged as a generating request is admitted and
corrected when its answer ends; over a limit, a 429 with Retry-After and OpenAI's x-ratelimit-* headers,
which admitted answers carry too. Budgets are GCRA clocks (buckets.py), here or in the shared store."""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from services.router.config import ListenerConfig, RouterConfig
from services.router.config.admission import NO_LIMITS, Limits
from services.router.decision.signals import approx_tokens
from services.router.errors import HTTPError
from services.router.listeners.buckets import WINDOW_S, Clocks, LocalBuckets, SharedBuckets, StoreDown
from services.router.listeners.caller import Caller
from services.router.listeners.usage import Usage
from services.router.metrics import RouterMetrics
from services.router.plugins.store.base import Store

# A request that names no max_tokens (max_completion_tokens, max_output_tokens) is charged this many output
# tokens at admission; its usage corrects the charge when it ends.
DEFAULT_OUTPUT_TOKENS = 256
MAX_CHOICES = 128  # `n` counted at most this high (the frontend refuses more)
_SLACK_S = 1e-6  # the clocks are kept to the microsecond


@dataclass(frozen=True, slots=True)
class Line:
    """One budget a request is charged to."""
    name: str  # its clock's
    kind: str  # requests, tokens
    level: str  # tenant, user
    per_minute: int
    who: str  # for the 429's message

    def seconds(self, units: float) -> float:
        return units * WINDOW_S / self.per_minute


@dataclass(slots=True)
class Charge:
    """An admitted request's charges, settled once when it ends."""
    lines: tuple[Line, ...]
    tokens: int  # charged at admission (the estimate)
    shared: bool  # charged in the store (else here: limits are local, or the store was down)
    usage: Usage | None  # its answer's usage, read by the relay (None: no token limit to correct)


def limits_of(listener: ListenerConfig, caller: Caller) -> tuple[Limits, Limits]:
    """The tenant's and the user's limits: the key's own where set, else the listener's."""
    settings = caller.settings
    tenant = settings.limits if settings.limits is not None else listener.limits
    if caller.user is None:
        return tenant, NO_LIMITS
    return tenant, settings.user_limits if settings.user_limits is not None else listener.user_limits


def lines_of(listener: ListenerConfig, caller: Caller) -> tuple[Line, ...]:
    tenant, user = limits_of(listener, caller)
    lines = []
    # Lengths before names: no listener, tenant and user names can make another's (a store keeps a digest).
    whose = f"{len(listener.name)}:{listener.name}:{len(caller.tenant)}:{caller.tenant}"
    for level, limits, name, who in (("tenant", tenant, whose, f"tenant {caller.tenant!r}"),
                                     ("user", user, f"{whose}:{caller.user}",
                                      f"user {caller.user!r} of tenant {caller.tenant!r}")):
        for kind, per_minute in (("requests", limits.requests_per_minute), ("tokens", limits.tokens_per_minute)):
            if per_minute is not None:
                lines.append(Line(f"{kind}:{level}:{name}", kind, level, per_minute, who))
    return tuple(lines)


def estimate_tokens(chat: dict[str, Any], text: str) -> int:
    """The prompt's tokens (UTF-8 bytes / 4: no tokenizer pass on the request path) plus what it may
    generate: max_tokens (the codecs carry max_completion_tokens and max_output_tokens over as it) or
    DEFAULT_OUTPUT_TOKENS, times `n`."""
    asked = chat.get("max_completion_tokens", chat.get("max_tokens"))
    out: int = asked if _whole(asked) else DEFAULT_OUTPUT_TOKENS
    n = chat.get("n")
    choices: int = min(n, MAX_CHOICES) if _whole(n) and n >= 1 else 1
    return approx_tokens(text) + choices * out


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def duration(seconds: float) -> str:
    """As OpenAI's x-ratelimit-reset-* write it (Go's durations): 0s, 12ms, 1s, 1.5s, 6m0s, 1h2m3s; rounded
    up to the millisecond, so that a client waiting that long finds the budget as said."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}" if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{secs}s"


def remaining(line: Line, at: float, now: float) -> int:
    """What is left of the line's budget with its clock at `at`: a minute's worth less what is ahead of now.
    A shared clock comes back rounded to the microsecond, so up to _SLACK_S ahead is nothing ahead."""
    ahead = max(0.0, at - now - _SLACK_S)
    return max(0, math.floor((WINDOW_S - ahead) * line.per_minute / WINDOW_S + 1e-9))


def rate_headers(lines: tuple[Line, ...], clocks: list[float], now: float) -> list[tuple[bytes, bytes]]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}; where both a tenant's and a user's
    budget count, the one with less left."""
    headers = []
    for kind in ("requests", "tokens"):
        mine = [(remaining(line, at, now), line, at) for line, at in zip(lines, clocks, strict=True)
                if line.kind == kind]
        if not mine:
            continue
        left, line, at = min(mine, key=lambda m: m[0])
        headers += [(f"x-ratelimit-limit-{kind}".encode(), str(line.per_minute).encode()),
                    (f"x-ratelimit-remaining-{kind}".encode(), str(left).encode()),
                    (f"x-ratelimit-reset-{kind}".encode(), duration(at - now).encode())]
    return headers


class RateLimiter:
    """The router's rate limits; `admit` for each generating request, `settle` when it ends. With no limits
    configured, admit returns None at once and nothing is kept."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics, store: Store | None = None, *,
                 clock: Callable[[], float] = time.time, local: LocalBuckets | None = None) -> None:
        self.metrics = metrics
        self.clock = clock
        self.local = local if local is not None else LocalBuckets()
        self.shared: SharedBuckets | None = None
        if config.admission.shared and store is not None:
            self.shared = SharedBuckets(store, config.admission.on_store_error, metrics.limit_store_errors.inc,
                                        self.local)
        self._settling: set[asyncio.Task[None]] = set()
        # The listeners where some limit is set (its own, or a key's): elsewhere admit is not even called.
        self._limited = frozenset(listener.name for listener in config.listeners if listener.limits
                                  or listener.user_limits or any(k.limits or k.user_limits
                                                                 for k in listener.keys.values()))

    def applies(self, listener: ListenerConfig) -> bool:
        return listener.name in self._limited

    async def admit(self, listener: ListenerConfig, caller: Caller, chat: dict[str, Any], text: str,
                    *, headers: list[tuple[bytes, bytes]] | None = None) -> Charge | None:
        """The request charged to its budgets, and their state added to `headers` (the response's); None
        where no limit applies. HTTPError 429 over a limit (nothing charged), 503 when shared limits cannot
        be counted (the store down, on_store_error closed)."""
        lines = lines_of(listener, caller)
        if not lines:
            return None
        tokens = estimate_tokens(chat, text) if any(line.kind == "tokens" for line in lines) else 0
        units = [1 if line.kind == "requests" else tokens for line in lines]
        for line, n in zip(lines, units, strict=True):
            if n > line.per_minute:  # more than a whole minute's budget: it would never fit
                self.metrics.limit_rejections.labels(caller.tenant, line.kind, line.level).inc()
                raise HTTPError(429, f"Request too large for the {line.kind} per minute of {line.who}: limit "
                                     f"{line.per_minute}, requested {n} (its prompt, estimated, and its max_tokens "
                                     f"or {DEFAULT_OUTPUT_TOKENS} if none)", headers=[(b"x-should-retry", b"false")])
        costs = [(line.name, line.seconds(n)) for line, n in zip(lines, units, strict=True)]
        now = self.clock()
        clocks, shared = await self._advance(costs, now)
        over = [i for i, at in enumerate(clocks) if at - now > WINDOW_S + _SLACK_S]
        if over:
            wait = max(clocks[i] - now - WINDOW_S for i in over)
            await self._give_back([(name, -s) for name, s in costs], now, shared)
            clocks = [at - s for at, (_, s) in zip(clocks, costs, strict=True)]  # as they are again
            for i in over:
                self.metrics.limit_rejections.labels(caller.tenant, lines[i].kind, lines[i].level).inc()
            line = lines[over[0]]
            raise HTTPError(429, f"Rate limit reached for {line.who} on {line.kind} per minute: limit "
                                 f"{line.per_minute}, requested {units[over[0]]}; try again in {duration(wait)}",
                            headers=[(b"retry-after", str(max(1, math.ceil(wait))).encode()),
                                     (b"retry-after-ms", str(max(1, math.ceil(wait * 1000))).encode()),
                                     *rate_headers(lines, clocks, now)])
        if headers is not None:
            headers += rate_headers(lines, clocks, now)
        usage = Usage(_asks_usage(chat)) if tokens else None
        return Charge(lines, tokens, shared, usage)

    def settle(self, charge: Charge | None, *, status: int, started: bool, cached: bool = False) -> None:
        """The request ended with `status`, its response `started` or not. A request the router refused itself
        (nothing started, not because the client left) is given back whole; otherwise its tokens are corrected
        to its answer's usage: none for a cached answer (nothing generated) or an upstream refusal, the
        estimate kept where no usage was seen. Shared budgets are corrected in the background."""
        if charge is None:
            return
        refused = not started and status != 499
        if refused or cached or (started and status != 200):
            actual = 0
        elif charge.usage is not None and charge.usage.tokens is not None:
            actual = charge.usage.tokens
        else:
            actual = charge.tokens
        costs = [(line.name, -line.seconds(1) if line.kind == "requests" else line.seconds(actual - charge.tokens))
                 for line in charge.lines if line.kind == "tokens" or refused]
        costs = [(name, s) for name, s in costs if s]
        if not costs:
            return
        now = self.clock()
        if not charge.shared or self.shared is None:
            self.local.advance(costs, now)
            return
        task = asyncio.get_running_loop().create_task(self.shared.give_back(costs, now))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _advance(self, costs: Clocks, now: float) -> tuple[list[float], bool]:
        if self.shared is None:
            return self.local.advance(costs, now), False
        try:
            return await self.shared.advance(costs, now)
        except StoreDown as exc:
            raise HTTPError(503, "Rate limits are shared through the store, which does not answer "
                                 f"({exc}); admission.on_store_error is closed, so requests are refused "
                                 "until it does") from None

    async def _give_back(self, costs: Clocks, now: float, shared: bool) -> None:
        """A refused request's charge undone where it was made."""
        if shared and self.shared is not None:
            await self.shared.give_back(costs, now)
        else:
            self.local.advance(costs, now)


def _asks_usage(chat: dict[str, Any]) -> bool:
    options = chat.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))
