"""Pools of replicas in the router process: readiness (health checks and a circuit breaker per replica),
the in-flight cap, leases, and the queue of requests waiting for a slot (fair_queue.py: each freed slot
handed to the next waiter); and the pools a config describes, built with their policies. No I/O:
dispatch and the health checker call in. The one replica scheduler of the router: chat pools and the
model runtime's deployments (runtime/deployments.py) are both Pools.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from services.router.backends.fair_queue import FULL, TTL, FairQueue, Ticket, Waiter
from services.router.backends.policies import Policy, build_policy
from services.router.backends.policies.least_outstanding import LeastOutstanding
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.prompt_ids import PromptModel
from services.router.backends.replica import CLOSED, HALF_OPEN, OPEN, Replica
from services.router.config import PoolConfig, RouterConfig
from services.router.config.admission import AdmissionConfig


@dataclass(slots=True, frozen=True)
class Overloaded:
    """Every ready replica is at the cap: 429 with Retry-After (after waiting in the queue, if it has one)."""
    retry_after_s: int
    reason: str = ""
    refusal: str = ""  # from the queue: FULL (no room, or no queue) or TTL (waited its class's queue_ttl_s)


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
        if self._pool is not None:
            self._pool.serve_queue()  # the slot goes straight to the next waiter: no herd, no polling


class Pool:
    def __init__(self, name: str, urls: Iterable[str], *, policy: Policy | None = None,
                 max_inflight: int = 32, failures: int = 3, cooldown_s: float = 30.0,
                 unhealthy_after: int = 1, retry_after_s: int = 1,
                 clock: Callable[[], float] = time.monotonic, kind: str = "pool",
                 queue: FairQueue | None = None) -> None:
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
        self.queue = queue  # None: 429 at once when every replica is at its cap

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

    async def wait(self, request_bytes: int, ticket: Ticket, *, text: str | None = None,
                   exclude: frozenset[str] = frozenset(), prepared: object = None,
                   retry: bool = False) -> Lease | Overloaded | NoReplica:
        """After `acquire` answered Overloaded: a slot handed over by `serve_queue` within the ticket's TTL;
        Overloaded (refusal FULL or TTL), or NoReplica when no ready replica is left for it. `retry`: the
        request had a slot and its replica failed; it waits first in line, even when the queue is full."""
        queue = self.queue
        if queue is None or (queue.full() and not retry):
            why = f"the queue is full ({queue.size} waiting)" if queue is not None else "it has no queue"
            return Overloaded(self.retry_after_s, f"{self.kind} {self.name!r}: every ready replica is at "
                              f"{self.max_inflight} in-flight requests and {why}", FULL)
        waiter = Waiter(ticket, self._clock(), asyncio.get_running_loop().create_future(), request_bytes, text,
                        exclude, prepared, retry)
        queue.add(waiter)
        slot = waiter.future
        try:
            async with asyncio.timeout(ticket.ttl_s):
                got: Lease | NoReplica = await slot
                return got
        except TimeoutError:
            if slot.done() and not slot.cancelled():
                return slot.result()  # handed over as the TTL ran out: take it
            return Overloaded(self.retry_after_s, f"{self.kind} {self.name!r}: no replica slot came free within "
                              f"the {ticket.priority!r} class's queue_ttl_s ({ticket.ttl_s:g}s)", TTL)
        except BaseException:
            # Cancelled (the client left, a deadline passed). The task's cancel cancelled `slot` too, so no
            # slot is handed to it; one handed over in the same loop pass goes on to the next waiter.
            if slot.done() and not slot.cancelled() and isinstance(slot.result(), Lease):
                slot.result().release(None)
            raise
        finally:
            queue.remove(waiter)

    def serve_queue(self) -> None:
        """Free slots to waiters in the queue's order, and NoReplica to those no ready replica is left for
        (at once, not at their TTL). Called whenever a slot may have come free or a replica's readiness
        changed: a lease released, a breaker closed or opened, a health check, new membership."""
        queue = self.queue
        if not queue:
            return
        now = self._clock()
        ready = {r.url for r in self.replicas if self._ready(r, now)}
        changed = True
        while changed:
            changed = False
            for w in queue.order():
                if w.future.done():  # cancelled: its client left or a deadline passed
                    queue.remove(w)
                elif not ready - w.exclude:
                    queue.remove(w)
                    tried = " (the rest were tried)" if w.exclude else ""
                    w.future.set_result(NoReplica(f"{self.kind} {self.name!r}: no ready replica is left "
                                                  f"for a queued request{tried}"))
                else:
                    got = self.acquire(w.request_bytes, text=w.text, exclude=w.exclude, prepared=w.prepared)
                    if not isinstance(got, Lease):
                        if w.exclude:
                            continue  # a retry that may not go where a slot is free: the next waiter may
                        return  # no free slot for anyone
                    queue.served(w)
                    w.future.set_result(got)
                changed = True
                break  # the queue changed: its order anew

    def queue_depths(self) -> dict[str, int]:
        """Waiting requests per priority class (none without a queue)."""
        return self.queue.depths() if self.queue is not None else {}

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
            self.serve_queue()
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
        self.serve_queue()  # an opened breaker may leave no ready replica: the waiters fail now
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
                self.serve_queue()  # the last ready one gone: the waiters fail now
            return
        replica.healthy, replica.health_detail, replica.health_failures = True, "", 0
        state = self._breaker_state(replica, now)
        if state == CLOSED:
            replica.seen_down = False
        elif replica.seen_down and (now if sent_at is None else sent_at) >= replica.opened_at:
            self._close(replica)
        # Back, closed, or its cool-down over (half-open is only ever noticed when asked): slots for waiters.
        self.serve_queue()

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
        self.serve_queue()

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
    """The config's pools, each with its own policy and queue, in file order."""
    return {name: _build_pool(p, config.admission) for name, p in config.pools.items()}


def load_models(config: RouterConfig, pools: dict[str, Pool]) -> None:
    """Once, before the first request: precise_prefix's chat templates and tokenizers, named by pools."""
    for name, pool in config.pools.items():
        policy = pools[name].policy
        if isinstance(policy, PrecisePrefix):
            policy.upstream_model = pool.model
            if pool.tokenizer:
                policy.model = PromptModel.load(pool.tokenizer)


def _build_pool(config: PoolConfig, admission: AdmissionConfig) -> Pool:
    urls = [r.url for r in config.replicas]
    clock = time.monotonic
    queue = (FairQueue(config.queue_size, tuple(c.name for c in admission.priorities), admission.starvation_s, clock)
             if config.queue_size else None)
    return Pool(config.name, urls, policy=build_policy(config), max_inflight=config.max_inflight,
                failures=config.breaker.failures, cooldown_s=config.breaker.cooldown_s,
                unhealthy_after=config.health.failures, clock=clock, queue=queue)
