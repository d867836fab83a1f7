"""The router's rate limiter's CPU per request (listeners/limits.py): admit and settle of a request charged to
a tenant's and a user's requests and tokens (four GCRA budgets), on one core, in the router's event loop;
beside it, where installed, the `limits` package's moving and sliding windows doing the same four hits.
`python -m bench.limits_cpu` prints microseconds per request."""
from __future__ import annotations

import asyncio
import time

from services.router.config import ListenerConfig, RouterConfig
from services.router.config.admission import KeySettings, Limits
from services.router.listeners.caller import Caller
from services.router.listeners.limits import RateLimiter
from services.router.metrics import RouterMetrics

N = 50_000
USERS = 1000
LISTENER = ListenerConfig("l", 8080, limits=Limits(10**9, 10**12), user_limits=Limits(10**9, 10**12))
CHAT = {"model": "m", "max_tokens": 256}
TEXT = "How do I rotate the API keys of the billing service? " * 20  # ~1 kB of prompt


async def ours() -> float:
    limiter = RateLimiter(RouterConfig(listeners=(LISTENER,), pools={}, entries={}), RouterMetrics({}))
    callers = [Caller("k", "acme", f"user-{i}", "standard", KeySettings()) for i in range(USERS)]
    started = time.process_time()
    for i in range(N):
        headers: list[tuple[bytes, bytes]] = []
        ticket = await limiter.admit(LISTENER, callers[i % USERS], CHAT, TEXT, headers=headers)
        assert ticket is not None and ticket.usage is not None
        ticket.usage.whole({"usage": {"total_tokens": 300}})
        limiter.settle(ticket, status=200, started=True)
    return (time.process_time() - started) / N * 1e6


def theirs() -> dict[str, float]:
    try:
        from limits import RateLimitItemPerMinute, storage, strategies  # type: ignore[import-not-found]
    except ImportError:
        return {}
    out = {}
    requests, tokens = RateLimitItemPerMinute(10**9), RateLimitItemPerMinute(10**12)
    for name in ("SlidingWindowCounterRateLimiter", "FixedWindowRateLimiter"):
        limiter = getattr(strategies, name)(storage.MemoryStorage())
        started = time.process_time()
        for i in range(N):
            user = f"user-{i % USERS}"
            cost = 256 + len(TEXT) // 4
            assert limiter.test(requests, "acme") and limiter.test(tokens, "acme", cost=cost)
            assert limiter.test(requests, "acme", user) and limiter.test(tokens, "acme", user, cost=cost)
            for item, cost_, keys in ((requests, 1, ("acme",)), (tokens, cost, ("acme",)),
                                      (requests, 1, ("acme", user)), (tokens, cost, ("acme", user))):
                limiter.hit(item, *keys, cost=cost_)
            limiter.get_window_stats(requests, "acme")
            limiter.get_window_stats(tokens, "acme")
        out[name] = (time.process_time() - started) / N * 1e6
    return out


def main() -> None:
    print(f"router limiter (admit + headers + usage + settle, 4 budgets): {asyncio.run(ours()):.1f} us/request")
    for name, us in theirs().items():
        print(f"limits {name} (test + hit x4 + 2 window stats, no refund): {us:.1f} us/request")


if __name__ == "__main__":
    main()
