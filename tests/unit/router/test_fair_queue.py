"""A pool's fair queue (services/router/backends/fair_queue.py, with pool.py's wait and hand-off): the order
slots are handed in (classes, tenants in turn, the starvation guard, retries first), the TTL, a full queue,
a waiter cancelled, hand-off on release and on a replica becoming ready, and fail-fast with no endpoint.
The queue's clock is a fake; no sleeps: each step waits on the waiter it expects."""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from services.router.backends.fair_queue import FULL, TTL, FairQueue, Ticket
from services.router.backends.pool import Lease, NoReplica, Overloaded, Pool
from services.router.config import parse_config
from services.router.config.admission import AdmissionConfig, PriorityClass

T = TypeVar("T")
CLASSES = ("high", "standard", "low")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pool(n: int = 1, *, size: int = 100, starvation_s: float = 10.0, max_inflight: int = 1) -> tuple[Pool, Clock]:
    clock = Clock()
    queue = FairQueue(size, CLASSES, starvation_s, clock)
    return Pool("chat", [f"http://r{i}" for i in range(n)], max_inflight=max_inflight, clock=clock,
                queue=queue), clock


def _ticket(tenant: str, cls: str = "standard", ttl_s: float = 30.0) -> Ticket:
    return Ticket(tenant, cls, CLASSES.index(cls), ttl_s)


def _lease(pool: Pool, **kw: Any) -> Lease:
    got = pool.acquire(10, **kw)
    assert isinstance(got, Lease), got
    return got


def run(coro: Coroutine[Any, Any, T]) -> T:
    # A deadline for a hang, never a synchronisation: 60 s, as one test took 13 s (0.12 s alone) in a full
    # run at a load of 7 on two cores (cause not found).
    return asyncio.run(asyncio.wait_for(coro, 60))


class Waiting:
    """Named waiters on a pool, and the order they are handed slots in."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.tasks: dict[str, asyncio.Task[Lease | Overloaded | NoReplica]] = {}
        self.served: list[str] = []

    async def add(self, name: str, ticket: Ticket, **kw: Any) -> None:
        """`name` queued (once this returns, it is in the queue)."""
        queue = self.pool.queue
        assert queue is not None
        before = len(queue)

        async def wait() -> Lease | Overloaded | NoReplica:
            got = await self.pool.wait(10, ticket, **kw)
            if isinstance(got, Lease):
                self.served.append(name)
            return got

        task = self.tasks[name] = asyncio.get_running_loop().create_task(wait())
        while len(queue) == before and not task.done():  # the task's first step queues it (or is refused)
            await asyncio.sleep(0)

    async def next(self) -> tuple[str, Any]:
        """The next waiter to finish (the first queued of those that did), and what it got ("cancelled")."""
        await asyncio.wait(self.tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        name = next(n for n, t in self.tasks.items() if t.done())
        task = self.tasks.pop(name)
        return name, "cancelled" if task.cancelled() else task.result()


def test_classes_highest_first_then_tenants_in_turn_fifo_within_a_tenant() -> None:
    async def go() -> list[str]:
        pool, _ = _pool()
        held = _lease(pool)
        w = Waiting(pool)
        for name in ("a1", "a2", "a3", "a4"):  # a flooding tenant, first in line
            await w.add(name, _ticket("a"))
        await w.add("b1", _ticket("b"))  # a quiet one, later
        await w.add("low1", _ticket("c", "low"))
        await w.add("c1", _ticket("c"))
        await w.add("b2", _ticket("b"))
        await w.add("high1", _ticket("d", "high"))
        for _ in range(9):
            held.release(True)
            name, got = await w.next()
            assert isinstance(got, Lease), (name, got)
            held = got
        return w.served

    # a, b and c in turn within standard, each in its own order; the high class first, the low one last.
    assert run(go()) == ["high1", "a1", "b1", "c1", "a2", "b2", "a3", "a4", "low1"]


def test_a_freed_slot_is_the_waiters_before_a_newcomer_can_take_it() -> None:
    async def go() -> tuple[object, str]:
        pool, _ = _pool()
        held = _lease(pool)
        w = Waiting(pool)
        await w.add("waiting", _ticket("a"))
        held.release(True)
        newcomer = pool.acquire(10)  # in the same step as the release: the slot is counted already
        name, got = await w.next()
        assert isinstance(got, Lease)
        return newcomer, name

    newcomer, name = run(go())
    assert isinstance(newcomer, Overloaded) and name == "waiting"


def test_a_tenant_with_many_queued_does_not_delay_one_with_one() -> None:
    async def go() -> int:
        pool, _ = _pool(max_inflight=2, size=1001)
        held = [_lease(pool), _lease(pool)]
        w = Waiting(pool)
        for i in range(1000):
            await w.add(f"flood{i}", _ticket("flood"))
        await w.add("quiet", _ticket("quiet"))
        for i in range(2):
            held[i].release(True)
            await w.next()
        return w.served.index("quiet")

    assert run(go()) == 1  # the second slot freed, behind one of the 1,000


def test_starvation_guard_puts_an_old_lower_waiter_before_higher_classes() -> None:
    async def go(age: float) -> list[str]:
        pool, clock = _pool(starvation_s=10.0)
        held = _lease(pool)
        w = Waiting(pool)
        await w.add("low-old", _ticket("x", "low"))
        clock.t += 0.5
        await w.add("std-old", _ticket("y"))
        clock.t += age
        await w.add("high1", _ticket("z", "high"))
        await w.add("high2", _ticket("z", "high"))
        for _ in range(4):
            held.release(True)
            _, got = await w.next()
            assert isinstance(got, Lease)
            held = got
        return w.served

    assert run(go(9.0)) == ["high1", "high2", "std-old", "low-old"]
    # Past starvation_s both go ahead of the high class, the oldest first.
    assert run(go(10.0)) == ["low-old", "std-old", "high1", "high2"]


def test_a_waiter_past_its_class_ttl_is_refused_and_leaves_the_queue() -> None:
    async def go() -> tuple[Lease | Overloaded | NoReplica, int, int]:
        pool, _ = _pool()
        held = _lease(pool)
        got = await pool.wait(10, _ticket("a", ttl_s=0.01))
        assert pool.queue is not None
        depth = len(pool.queue)
        held.release(True)
        return got, depth, held.replica.inflight

    got, depth, inflight = run(go())
    assert isinstance(got, Overloaded) and got.refusal == TTL and got.retry_after_s == 1
    assert "within the 'standard' class's queue_ttl_s (0.01s)" in got.reason
    assert (depth, inflight) == (0, 0)  # no slot handed to the one that left


def test_a_full_queue_refuses_at_once_but_a_retry_still_queues() -> None:
    async def go() -> tuple[Lease | Overloaded | NoReplica, list[str]]:
        pool, _ = _pool(2, size=2)
        held = [_lease(pool), _lease(pool)]
        w = Waiting(pool)
        await w.add("one", _ticket("a"))
        await w.add("two", _ticket("b"))
        await w.add("refused", _ticket("c"))
        refused = (await w.next())[1]
        # Retries are not counted against size: they had a slot already, and go first.
        await w.add("retry", _ticket("d"), exclude=frozenset({"http://r0"}), retry=True)
        held[0].release(True)  # r0: the retry may not go back there; "one" takes it
        await w.next()
        held[1].release(True)
        await w.next()
        return refused, w.served

    refused, served = run(go())
    assert isinstance(refused, Overloaded) and refused.refusal == FULL
    assert "the queue is full (2 waiting)" in refused.reason
    assert served == ["one", "retry"]


def test_without_a_queue_it_is_429_at_once() -> None:
    async def go() -> Lease | Overloaded | NoReplica:
        pool = Pool("chat", ["http://r0"], max_inflight=1)
        _lease(pool)
        return await pool.wait(10, _ticket("a"))

    got = run(go())
    assert isinstance(got, Overloaded) and got.refusal == FULL and "it has no queue" in got.reason


def test_a_cancelled_waiter_leaves_at_once_and_is_never_handed_a_slot() -> None:
    async def go() -> tuple[int, int, list[str], bool]:
        pool, _ = _pool()
        assert pool.queue is not None
        held = _lease(pool)
        w = Waiting(pool)
        await w.add("gone", _ticket("a"))
        await w.add("next", _ticket("b"))
        w.tasks["gone"].cancel()  # the client left ...
        held.release(True)  # ... and a slot frees in the same loop pass: it goes past the cancelled one
        assert await w.next() == ("gone", "cancelled")
        name, got = await w.next()
        assert name == "next" and isinstance(got, Lease)
        return len(pool.queue), got.replica.inflight, w.served, True

    assert run(go()) == (0, 1, ["next"], True)


def test_a_slot_handed_to_a_waiter_cancelled_before_it_ran_goes_on_to_the_next() -> None:
    async def go() -> tuple[int, list[str]]:
        pool, _ = _pool()
        held = _lease(pool)
        w = Waiting(pool)
        await w.add("gone", _ticket("a"))
        await w.add("next", _ticket("b"))
        held.release(True)  # handed to "gone" ...
        w.tasks["gone"].cancel()  # ... which is cancelled before it could take it
        done = dict([await w.next(), await w.next()])
        got = done["next"]
        assert isinstance(got, Lease) and done["gone"] == "cancelled"
        return got.replica.inflight, w.served

    assert run(go()) == (1, ["next"])


def test_a_replica_becoming_ready_serves_the_queue() -> None:
    async def go() -> str:
        pool, _ = _pool(2)
        pool.record_health(pool.replicas[1], False)  # r1 out
        _lease(pool)  # r0 full
        w = Waiting(pool)
        await w.add("one", _ticket("a"))
        pool.record_health(pool.replicas[1], True)  # r1 back: its slot goes to the waiter
        _, got = await w.next()
        assert isinstance(got, Lease)
        return got.replica.url

    assert run(go()) == "http://r1"


def test_a_breaker_cool_down_ending_serves_the_queue_at_the_next_health_check() -> None:
    async def go() -> str:
        pool, clock = _pool(2)
        bad = _lease(pool)
        assert bad.replica.url == "http://r0"
        for _ in range(3):
            pool.record_failure(bad.replica)  # r0's breaker opens
        bad.release(None)
        _lease(pool)  # r1 full
        w = Waiting(pool)
        await w.add("one", _ticket("a"))
        clock.t += 60  # r0 half-open: a probe may go, noticed at the next check (which passes)
        pool.record_health(pool.replicas[1], True)
        _, got = await w.next()
        assert isinstance(got, Lease) and got.probe
        return got.replica.url

    assert run(go()) == "http://r0"


def test_waiters_fail_at_once_when_the_last_ready_replica_goes() -> None:
    async def go() -> list[Lease | Overloaded | NoReplica]:
        pool, _ = _pool(1)
        _lease(pool)
        w = Waiting(pool)
        await w.add("one", _ticket("a"))
        await w.add("two", _ticket("b", "low"))
        pool.record_health(pool.replicas[0], False)  # TTL 30 s: they must not wait for it
        return [(await w.next())[1], (await w.next())[1]]

    got = run(go())
    assert all(isinstance(g, NoReplica) and "no ready replica is left" in g.reason for g in got)


def test_ticket_of_the_admission_config() -> None:
    admission = AdmissionConfig((PriorityClass("gold", 5.0), PriorityClass("standard", 30.0)))
    assert Ticket.of(admission, "t", "standard") == Ticket("t", "standard", 1, 30.0)
    assert Ticket.of(admission, "t", "gold") == Ticket("t", "gold", 0, 5.0)


def test_a_pool_gets_a_queue_only_with_a_queue_size() -> None:
    from services.router.backends.pool import build_pools
    config = parse_config({"listeners": [{"port": 8080}],
                           "admission": {"priorities": [{"name": "high"}, {"name": "standard"}]},
                           "pools": {"p": {"model": "m", "replicas": [{"url": "http://a"}], "queue_size": 7},
                                     "q": {"model": "m", "replicas": [{"url": "http://b"}]}},
                           "entries": {"fleet": {"default": ["p"]}}})
    pools = build_pools(config)
    queue = pools["p"].queue
    assert queue is not None and (queue.size, queue.names) == (7, ("high", "standard"))
    assert pools["q"].queue is None and pools["q"].queue_depths() == {}
    assert pools["p"].queue_depths() == {"high": 0, "standard": 0}


def test_queue_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue size must be >= 1, got 0"):
        FairQueue(0, CLASSES, 10.0, Clock())


# ---- through dispatch: the router's app over a fake upstream ----

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


class App:
    """A RouterApp over the fake upstream: pool p (A, B), pool q (C), one replica slot each."""

    def __init__(self, p: dict[str, Any], q: dict[str, Any] | None = None) -> None:
        from services.router.app import RouterApp
        from services.router.backends.pool import build_pools
        from services.router.decision.engine import Router
        from services.router.metrics import RouterMetrics
        from tests.support.fake_upstream import FakeUpstream, Reply, completion
        config = parse_config({
            "listeners": [{"port": 8080}],
            "pools": {"p": {"model": "p-m", "replicas": [{"url": A}, {"url": B}], "max_inflight": 1, **p},
                      "q": {"model": "q-m", "replicas": [{"url": C}], "max_inflight": 1, **(q or {})}},
            "entries": {"fleet": {"default": ["p"]}, "spill": {"default": ["p", "q"]}}})
        self.pools = build_pools(config)
        self.upstream = FakeUpstream()
        for url in (A, B, C):
            self.upstream.answer(url, Reply(chunks=(completion("ok"),)))
        self.metrics = RouterMetrics(self.pools)
        self.app = RouterApp(config, Router(config), self.pools, self.upstream, self.metrics)

    async def chat(self, model: str = "fleet") -> Any:
        from tests.support.asgi_client import request
        return await request(self.app, "POST", "/v1/chat/completions",
                             {"model": model, "messages": [{"role": "user", "content": "hi"}]})

    async def queued(self, pool: str, n: int) -> None:
        queue = self.pools[pool].queue
        assert queue is not None
        while len(queue) != n:
            await asyncio.sleep(0)

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_queued_request_is_answered_when_a_slot_frees_and_counted() -> None:
    async def go() -> tuple[Any, App]:
        app = App({"queue_size": 4})
        held = [_lease(app.pools["p"]), _lease(app.pools["p"])]
        task = asyncio.get_running_loop().create_task(app.chat())
        await app.queued("p", 1)
        held[1].release(True)
        return await task, app

    r, app = run(go())
    assert r.status == 200 and r.headers["x-router-replica"] == B
    assert app.count("router_queue_served_total", pool="p", **{"class": "standard"}) == 1
    assert app.count("router_queue_wait_seconds_count", pool="p", **{"class": "standard"}) == 1
    assert app.count("router_queue_depth", pool="p", **{"class": "standard"}) == 0


def test_without_a_queue_it_is_still_429_at_once_counted_as_full() -> None:
    async def go() -> tuple[Any, App]:
        app = App({})
        _lease(app.pools["p"]), _lease(app.pools["p"])
        return await app.chat(), app

    r, app = run(go())
    assert r.status == 429 and r.headers["retry-after"] == "1"
    assert app.count("router_queue_rejections_total", pool="p", tenant="-", reason="full",
                     **{"class": "standard"}) == 1


def test_a_retry_after_a_failed_replica_waits_for_a_slot_rather_than_a_502() -> None:
    from tests.support.fake_upstream import Reply, completion

    async def go() -> tuple[Any, Any]:
        app = App({"queue_size": 4})
        app.upstream.answer(A, Reply(refuse="connection refused"), Reply(chunks=(completion("ok"),)))
        held = _lease(app.pools["p"], exclude=frozenset({A}))  # B busy
        first = asyncio.get_running_loop().create_task(app.chat())  # to A, refused: retried, waits for B
        await app.queued("p", 1)
        second = asyncio.get_running_loop().create_task(app.chat())  # A is free again: straight there
        held.release(True)  # B's slot: the retry's, not a later arrival's
        return await first, await second

    first, second = run(go())
    assert first.status == 200 and first.headers["x-router-replica"] == B
    assert first.headers["x-router-attempts"] == "2"
    assert second.status == 200 and second.headers["x-router-replica"] == A


def test_a_plan_of_several_pools_waits_in_the_first_with_a_queue() -> None:
    async def go() -> Any:
        app = App({}, {"queue_size": 2})
        _lease(app.pools["p"]), _lease(app.pools["p"])
        held = _lease(app.pools["q"])
        task = asyncio.get_running_loop().create_task(app.chat("spill"))
        await app.queued("q", 1)
        held.release(True)
        return await task

    r = run(go())
    assert r.status == 200 and r.headers["x-router-pool"] == "q"
