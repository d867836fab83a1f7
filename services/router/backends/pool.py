"""Pools of replicas in the router process: readiness (health checks and a circuit breaker per replica),
the in-flight cap, and leases; and the pools a config describes, built with their policies. No I/O:
dispatch and the health checker call in. The one replica scheduler of the router: chat pools and the
model runtime's deployments (runtime/deployments.py) are both Pools.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from services.router.backends.policies import Policy, build_policy
from services.router.backends.policies.least_outstanding import LeastOutstanding
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.prompt_ids import PromptModel
from services.router.backends.replica import CLOSED, HALF_OPEN, OPEN, Replica
from services.router.config import PoolConfig, RouterConfig


@dataclass(slots=True, frozen=True)
class Overloaded:
    """Every ready replica is at the cap: answer 429 with Retry-After at once, never queue."""
    retry_after_s: int
    reason: str = ""


@dataclass(slots=True, frozen=True)
class NoReplica:
    """No replica is ready (503); the reason gives each replica's state."""
    reason: str


@dataclass(slots=True, eq=False)
class Lease:
    replica: Replica
    request_bytes: int
    reason: str = ""  # the policy's explanation of this choice
    probe: bool = False  # sent while the breaker was half-open: its outcome decides the breaker
    _pool: Pool | None = field(default=None, repr=False)
    _probe_of: float = field(default=0.0, repr=False)  # the opening (opened_at) this probe tests
    _outcome: bool | None = field(default=None, repr=False)  # recorded success / failure
    _released: bool = field(default=False, repr=False)

    def succeeded(self) -> None:
        """The replica answered (a response head that is not 5xx or 429): recorded once."""
        if self._outcome is None and self._pool is not None:
            self._outcome = True
            self._pool.record_success(self.replica, probe=self.probe)

    def failed(self, *, unreachable: bool = False) -> None:
        """A failure that blames the replica (connect error, 5xx, a response that broke off);
        `unreachable`: no connection could be made or it dropped before the head (it may be down)."""
        if self._outcome is not False and self._pool is not None:
            self._outcome = False
            self._pool.record_failure(self.replica, probe=self.probe, unreachable=unreachable)

    def release(self, ok: bool | None, *, unreachable: bool = False) -> None:
        """The request is over: ok=True succeeded, False failed (see above), None abandoned (the
        client left, a deadline passed), which says nothing about the replica. Only the first call counts."""
        if self._released:
            return
        self._released = True
        if ok:
            self.succeeded()
        elif ok is False:
            self.failed(unreachable=unreachable)
        self.replica.inflight -= 1
        self.replica.outstanding_bytes -= self.request_bytes
        r = self.replica
        if self.probe and self._outcome is None and r.breaker == HALF_OPEN and r.opened_at == self._probe_of:
            r.probe_inflight = False  # an abandoned probe: the next request probes


class Pool:
    def __init__(self, name: str, urls: Iterable[str], *, policy: Policy | None = None,
                 max_inflight: int = 32, failures: int = 3, cooldown_s: float = 30.0,
                 unhealthy_after: int = 1, retry_after_s: int = 1,
                 clock: Callable[[], float] = time.monotonic, kind: str = "pool") -> None:
        for key, value, low in (("max_inflight", max_inflight, 1), ("failures", failures, 1),
                                ("unhealthy_after", unhealthy_after, 1), ("retry_after_s", retry_after_s, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{kind} {name!r}: {key} must be an integer >= {low}, got {value!r}")
        if not cooldown_s >= 0:
            raise ValueError(f"{kind} {name!r}: cooldown_s must be >= 0, got {cooldown_s!r}")
        self.name = name
        self.kind = kind  # what the messages call it: "pool", or "deployment" for a decision model's workers
        self.policy: Policy = policy if policy is not None else LeastOutstanding()
        self.max_inflight = max_inflight
        self.failures = failures
        self.unhealthy_after = unhealthy_after
        self.cooldown_s = cooldown_s
        self.retry_after_s = retry_after_s
        self.replicas: list[Replica] = [Replica(url) for url in dict.fromkeys(urls)]
        self._clock = clock
        self._seq = 0
        self._departed: dict[str, Replica] = {}  # left the pool with requests still running

    # ---- scheduling ----

    async def prepare(self, body: dict[str, Any], size: int) -> object:
        """The policy's work on a request before it chooses (see Policy.prepare): pass the result to
        acquire and preview as `prepared`."""
        return await self.policy.prepare(body, size)

    def acquire(self, request_bytes: int, *, text: str | None = None, exclude: frozenset[str] = frozenset(),
                prepared: object = None) -> Lease | Overloaded | NoReplica:
        """Pick a replica and count the request on it. `exclude`: URLs already tried for this request."""
        picked = self.preview(request_bytes, text=text, exclude=exclude, prepared=prepared)
        if not isinstance(picked, Replica):
            return picked
        picked.inflight += 1
        picked.outstanding_bytes += request_bytes
        self._seq += 1
        picked.last_assigned = self._seq
        probe = picked.breaker == HALF_OPEN
        if probe:
            picked.probe_inflight = True
        self.policy.on_assigned(picked, text, prepared)
        return Lease(picked, request_bytes, self.policy.last_reason, probe, self, picked.opened_at)

    def preview(self, request_bytes: int, *, text: str | None = None, exclude: frozenset[str] = frozenset(),
                prepared: object = None) -> Replica | Overloaded | NoReplica:
        """The choice `acquire` would make, without counting it (for /v1/router/explain); the policy's
        `last_reason` explains it."""
        if request_bytes < 0:
            raise ValueError(f"request_bytes must be >= 0, got {request_bytes}")
        now = self._clock()
        candidates: list[Replica] = []
        ready = 0
        for r in self.replicas:
            if r.url in exclude or not self._ready(r, now):
                continue
            ready += 1
            # Half-open: one probe at a time; requests from before the breaker opened may still run.
            if r.inflight < self.max_inflight and not (r.breaker == HALF_OPEN and r.probe_inflight):
                candidates.append(r)
        if candidates:
            return self.policy.choose(candidates, request_bytes, text, prepared)
        if ready:
            return Overloaded(self.retry_after_s, f"{self.kind} {self.name!r}: all {ready} ready replicas are "
                              f"at {self.max_inflight} in-flight requests or probing")
        if not self.replicas:
            return NoReplica(f"{self.kind} {self.name!r} has no replicas")
        return NoReplica(f"{self.kind} {self.name!r}: no ready replica: " + "; ".join(
            f"{r.url}: {self._describe(r, now, exclude)}" for r in self.replicas))

    # ---- health and breaker ----
    #
    # The breaker is passive: request failures open it (`failures` in a row), and it shuts the replica
    # out for `cooldown_s`; then it is half-open: one probe request at a time, whose response head
    # closes it and whose failure opens it for another cool-down. Active health checks decide
    # `healthy` and never open the breaker or restart a cool-down; a passing check sent after the
    # breaker opened closes it at once when the replica was seen down meanwhile (it came back, as
    # Envoy un-ejects a host on a passing active check).

    def now(self) -> float:
        """The pool's clock: when a health check is sent, for record_health(sent_at=...)."""
        return self._clock()

    def record_success(self, replica: Replica, *, probe: bool = False) -> None:
        """Only the half-open probe closes the breaker; requests from before it opened change nothing."""
        state = self._breaker_state(replica, self._clock())
        if probe and state == HALF_OPEN:
            self._close(replica)
        elif state == CLOSED:
            replica.request_failures = 0
            replica.seen_down = False

    def record_failure(self, replica: Replica, *, probe: bool = False, unreachable: bool = False) -> None:
        now = self._clock()
        if unreachable:
            replica.seen_down = True
        state = self._breaker_state(replica, now)
        if probe and state == HALF_OPEN:
            self._open(replica, now)
        elif state == CLOSED:
            replica.request_failures += 1
            if replica.request_failures >= self.failures:
                self._open(replica, now)
        # Failures while open come from requests sent before it opened: they do not restart the cool-down.

    def record_health(self, replica: Replica, ok: bool, *, detail: str = "", sent_at: float | None = None) -> None:
        """An active check's result; `sent_at`: when it was sent (now()), default now. `unhealthy_after`
        consecutive failed checks take the replica out (one slow answer under load should not empty a
        pool), one pass brings it back. A pass closes an open or half-open breaker if the replica was
        seen down since it was last seen up and the check was sent after the breaker opened (one sent
        before could have been answered just before the replica died). A replica whose checks pass all
        along while its requests fail waits for the cool-down and a probe: the check answering proves
        nothing about the requests."""
        now = self._clock()
        if not ok:
            replica.health_failures += 1
            replica.health_detail = detail or "health check failed"
            replica.seen_down = True
            if replica.health_failures >= self.unhealthy_after:
                replica.healthy = False
            return
        replica.healthy, replica.health_detail, replica.health_failures = True, "", 0
        state = self._breaker_state(replica, now)
        if state == CLOSED:
            replica.seen_down = False
        elif replica.seen_down and (now if sent_at is None else sent_at) >= replica.opened_at:
            self._close(replica)

    def is_ready(self, replica: Replica) -> bool:
        return self._ready(replica, self._clock())

    # ---- membership and reporting ----

    def get(self, url: str) -> Replica | None:
        return next((r for r in self.replicas if r.url == url), None)

    def replace_replicas(self, urls: Iterable[str]) -> None:
        """New membership (DNS refresh). URLs that stay keep their load, health and breaker; one that
        leaves with requests still running and comes back gets its counts back, so its cap holds."""
        old = {r.url: r for r in self.replicas}
        known = {**self._departed, **old}
        self.replicas = [known.get(url) or Replica(url) for url in dict.fromkeys(urls)]
        present = {r.url for r in self.replicas}
        for url in old.keys() - present:
            self.policy.on_removed(url)
        self._departed = {url: r for url, r in known.items() if url not in present and r.inflight > 0}

    def snapshot(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [{"url": r.url, "ready": self._ready(r, now), "healthy": r.healthy,
                 "breaker": self._breaker_state(r, now), "inflight": r.inflight,
                 "outstanding_bytes": r.outstanding_bytes,
                 "consecutive_failures": max(r.request_failures, r.health_failures)}
                for r in self.replicas]

    # ---- internals ----

    def _ready(self, r: Replica, now: float) -> bool:
        return r.healthy and self._breaker_state(r, now) != OPEN

    def _breaker_state(self, r: Replica, now: float) -> str:
        if r.breaker == OPEN and now - r.opened_at >= self.cooldown_s:
            r.breaker, r.probe_inflight = HALF_OPEN, False
        return r.breaker

    @staticmethod
    def _open(r: Replica, now: float) -> None:
        r.breaker, r.opened_at, r.probe_inflight = OPEN, now, False

    @staticmethod
    def _close(r: Replica) -> None:
        r.breaker, r.probe_inflight, r.seen_down = CLOSED, False, False
        r.request_failures = 0

    def _describe(self, r: Replica, now: float, exclude: frozenset[str]) -> str:
        states = []
        if r.url in exclude:
            states.append("excluded (already tried for this request)")
        if not r.healthy:
            states.append(f"unhealthy ({r.health_detail})")
        if self._breaker_state(r, now) == OPEN:
            states.append(f"breaker open after {r.request_failures} consecutive failures, half-open in "
                          f"{r.opened_at + self.cooldown_s - now:.1f}s" +
                          (" or at its next passing health check" if r.seen_down else ""))
        return ", ".join(states) or "ready"


def build_pools(config: RouterConfig) -> dict[str, Pool]:
    """The config's pools, each with its own policy, in file order."""
    return {name: _build_pool(p) for name, p in config.pools.items()}


def load_models(config: RouterConfig, pools: dict[str, Pool]) -> None:
    """Once, before the first request: precise_prefix's chat templates and tokenizers, named by pools."""
    for name, pool in config.pools.items():
        policy = pools[name].policy
        if isinstance(policy, PrecisePrefix):
            policy.upstream_model = pool.model
            if pool.tokenizer:
                policy.model = PromptModel.load(pool.tokenizer)


def _build_pool(config: PoolConfig) -> Pool:
    urls = [r.url for r in config.replicas]
    return Pool(config.name, urls, policy=build_policy(config), max_inflight=config.max_inflight,
                failures=config.breaker.failures, cooldown_s=config.breaker.cooldown_s,
                unhealthy_after=config.health.failures)
