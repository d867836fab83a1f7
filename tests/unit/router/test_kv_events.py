"""The router's KvEvents subscriber against a fake frontend relay on a real local grpc.aio port:
snapshot, live changes, resume after a broken stream, a new relay after the server went away, a
rank cleared on restart, a gap, and the policy choosing by what the stream reported."""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from protocol.block_hash import block_hashes
from protocol.grpc import pb2, pb2_grpc
from services.router.backends.kv_events import KvSubscriber
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.prompt_ids import PromptModel
from services.router.backends.replica import Replica

KEY = "sk-kv"
DEADLINE_S = 10.0


class FakeRelay(pb2_grpc.KvEventsServicer, pb2_grpc.ControlServicer):  # type: ignore[misc]
    """A frontend's relay: a history of events numbered from 1 in one relay epoch, what each rank
    holds, a snapshot for a subscriber it cannot resume, and live events pushed to open streams."""

    def __init__(self, relay_epoch: str, block_size: int = 16) -> None:
        self.relay_epoch = relay_epoch
        self.block_size = block_size
        self.history: list[Any] = []
        self.held: dict[int, tuple[str, set[int]]] = {}  # rank -> (epoch, hashes)
        self.info = pb2.GetModelInfoResponse(block_size=block_size, max_model_len=4096)
        self.requests: list[tuple[int, str]] = []
        self.keys: list[str] = []
        self._streams: list[asyncio.Queue[Any]] = []

    # ---- what the engines did ----

    def stored(self, rank: int, epoch: str, hashes: list[int]) -> None:
        self.held.setdefault(rank, (epoch, set()))[1].update(hashes)
        self._push(rank, epoch, stored=pb2.BlocksStored(block_hashes=hashes, block_size=self.block_size))

    def removed(self, rank: int, epoch: str, hashes: list[int]) -> None:
        self.held[rank][1].difference_update(hashes)
        self._push(rank, epoch, removed=pb2.BlocksRemoved(block_hashes=hashes))

    def cleared(self, rank: int, epoch: str) -> None:
        self.held[rank] = (epoch, set())
        self._push(rank, epoch, cleared=pb2.AllBlocksCleared())

    def drop_streams(self) -> None:
        """Break every open stream (as a frontend's connection breaking would)."""
        for queue in self._streams:
            queue.put_nowait(None)

    def _push(self, rank: int, epoch: str, **event: Any) -> None:
        ev = pb2.KvEvent(seq=len(self.history) + 1, rank=rank, epoch=epoch, relay_epoch=self.relay_epoch, **event)
        self.history.append(ev)
        for queue in self._streams:
            queue.put_nowait(ev)

    # ---- the services ----

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.requests.append((request.after_seq, request.relay_epoch))
        self.keys.append(dict(context.invocation_metadata()).get("authorization", ""))
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams.append(queue)
        try:
            seq = len(self.history)
            if request.relay_epoch == self.relay_epoch and 0 < request.after_seq <= seq:
                for ev in self.history[request.after_seq:]:
                    yield ev
            else:
                for rank, (epoch, hashes) in sorted(self.held.items()):
                    common = {"seq": seq, "rank": rank, "epoch": epoch, "snapshot": True,
                              "relay_epoch": self.relay_epoch}
                    yield pb2.KvEvent(cleared=pb2.AllBlocksCleared(), **common)
                    yield pb2.KvEvent(stored=pb2.BlocksStored(block_hashes=sorted(hashes),
                                                              block_size=self.block_size), **common)
            while (ev := await queue.get()) is not None:
                yield ev
            await context.abort(grpc.StatusCode.UNAVAILABLE, "relay restarting")
        finally:
            self._streams.remove(queue)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(relay: FakeRelay, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb2_grpc.add_KvEventsServicer_to_server(relay, server)
    pb2_grpc.add_ControlServicer_to_server(relay, server)
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server


async def _until(sub: KvSubscriber, holds: Callable[[], bool]) -> None:
    """Wait, bounded, until `holds()` after the subscriber applied events."""
    async def wait() -> None:
        while not holds():
            sub.changed.clear()
            await sub.changed.wait()
    await asyncio.wait_for(wait(), DEADLINE_S)


@contextlib.asynccontextmanager
async def _subscribed(policy: PrecisePrefix, port: int) -> AsyncIterator[KvSubscriber]:
    sub = KvSubscriber("http://fe", f"127.0.0.1:{port}", policy, api_key=KEY, backoff_s=0.01, backoff_max_s=0.05)
    task = asyncio.create_task(sub.run())
    try:
        yield sub
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


H = block_hashes(list(range(16 * 8)), 16)  # eight chained blocks


def test_a_snapshot_then_live_changes() -> None:
    async def main() -> None:
        relay, port, policy = FakeRelay("relay-1"), _free_port(), PrecisePrefix()
        relay.stored(0, "e0", H[:4])
        relay.stored(1, "e1", H[:2])
        server = await _serve(relay, port)
        try:
            async with _subscribed(policy, port) as sub:
                held = sub.blocks
                await _until(sub, lambda: held.match(H) == (4, 0) and 1 in held.ranks)
                assert held.connected and policy.block_size == 16
                assert relay.requests == [(0, "")] and relay.keys == [f"Bearer {KEY}"]
                relay.stored(1, "e1", H[2:7])
                await _until(sub, lambda: held.match(H) == (7, 1))
                relay.removed(1, "e1", H[5:7])
                await _until(sub, lambda: held.match(H) == (5, 1))
                assert held.seq == 4 and held.relay_epoch == "relay-1"
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_broken_stream_resumes_after_the_last_event() -> None:
    async def main() -> None:
        relay, port, policy = FakeRelay("relay-1"), _free_port(), PrecisePrefix()
        server = await _serve(relay, port)
        try:
            async with _subscribed(policy, port) as sub:
                relay.stored(0, "e0", H[:2])
                await _until(sub, lambda: sub.blocks.match(H) == (2, 0))
                relay.drop_streams()
                relay.stored(0, "e0", H[2:5])  # while it is away: the resume must replay it
                await _until(sub, lambda: sub.blocks.match(H) == (5, 0) and sub.streams == 2)
                assert relay.requests == [(0, ""), (1, "relay-1")]
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_after_the_server_went_away_a_new_relay_starts_from_its_snapshot() -> None:
    async def main() -> None:
        relay, port, policy = FakeRelay("relay-1"), _free_port(), PrecisePrefix()
        relay.stored(0, "e0", H[:6])
        relay.stored(3, "e3", H[:1])
        server = await _serve(relay, port)
        async with _subscribed(policy, port) as sub:
            await _until(sub, lambda: sub.blocks.match(H) == (6, 0))
            await server.stop(None)
            await _until(sub, lambda: not sub.blocks.connected)
            restarted = FakeRelay("relay-2")  # the frontend restarted: its engines hold less, rank 3 is gone
            restarted.stored(0, "e0b", H[:3])
            server = await _serve(restarted, port)
            try:
                await _until(sub, lambda: sub.blocks.match(H) == (3, 0) and sub.blocks.connected)
                assert restarted.requests[0] == (2, "relay-1")  # it asked to resume; the relay could not
                assert set(sub.blocks.ranks) == {0} and sub.blocks.relay_epoch == "relay-2"
            finally:
                await server.stop(None)

    asyncio.run(main())


def test_a_rank_whose_engine_restarts_is_cleared() -> None:
    async def main() -> None:
        relay, port, policy = FakeRelay("relay-1"), _free_port(), PrecisePrefix()
        relay.stored(0, "e0", H)
        relay.stored(1, "e1", H[:3])
        server = await _serve(relay, port)
        try:
            async with _subscribed(policy, port) as sub:
                await _until(sub, lambda: sub.blocks.match(H) == (8, 0))
                relay.cleared(0, "e0-new")
                await _until(sub, lambda: sub.blocks.match(H) == (3, 1))
                assert sub.blocks.epochs[0] == "e0-new" and sub.blocks.ranks[0] == set()
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_gap_in_the_sequence_resubscribes_from_a_snapshot() -> None:
    async def main() -> None:
        relay, port, policy = FakeRelay("relay-1"), _free_port(), PrecisePrefix()
        server = await _serve(relay, port)
        try:
            async with _subscribed(policy, port) as sub:
                relay.stored(0, "e0", H[:2])
                await _until(sub, lambda: sub.blocks.match(H) == (2, 0))
                relay.history.append(None)  # a number lost: the next event skips one
                relay.held[0][1].update(H[2:4])  # ... and what it said is only in the snapshot
                relay.stored(0, "e0", H[4:5])
                await _until(sub, lambda: sub.blocks.match(H) == (5, 0))
                assert relay.requests == [(0, ""), (0, "relay-1")]
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_the_policy_sends_a_prompt_where_the_stream_says_its_blocks_are() -> None:
    async def main() -> None:
        policy = PrecisePrefix()
        policy.model = PromptModel.load("tiny")
        body = {"messages": [{"role": "user", "content": "A long shared context. " * 20 + "Question?"}]}
        ids = policy.model.prompt_now(body).ids
        relays = [FakeRelay("a"), FakeRelay("b")]
        ports = [_free_port(), _free_port()]
        relays[1].stored(0, "e", block_hashes(ids, 16))
        servers = [await _serve(r, p) for r, p in zip(relays, ports, strict=True)]
        subs = [KvSubscriber(f"http://fe{i}", f"127.0.0.1:{p}", policy, backoff_s=0.01) for i, p in enumerate(ports)]
        tasks = [asyncio.create_task(s.run()) for s in subs]
        try:
            await _until(subs[1], lambda: subs[1].blocks.blocks > 0)
            prompt = await policy.prepare(body, 100)
            replicas = [Replica("http://fe0"), Replica("http://fe1", last_assigned=1)]
            assert policy.choose(replicas, 100, None, prompt) is replicas[1]
            assert policy.last_reason.startswith(f"precise_prefix: {len(ids) // 16}/{len(ids) // 16} blocks (1.00)")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for server in servers:
                await server.stop(None)

    asyncio.run(main())


def test_a_frontend_with_another_tokenizer_or_template_is_not_scored() -> None:
    async def main() -> None:
        policy = PrecisePrefix()
        model = policy.model = PromptModel.load("tiny")
        relay, port = FakeRelay("relay-1"), _free_port()
        relay.stored(0, "e0", H)
        relay.info.tokenizer_sha256, relay.info.chat_template_sha256 = model.tokenizer_sha256, "0" * 64
        server = await _serve(relay, port)
        try:
            async with _subscribed(policy, port) as sub:
                await _until(sub, lambda: sub.blocks.blocks > 0)
                assert sub.blocks.mismatch.startswith("its chat template (sha256 000000000000) is not the pool's")
                assert sub.blocks.match(H) == (0, -1)
                assert model.max_model_len == 4096
                relay.info.chat_template_sha256 = model.template.sha256  # the frontend was redeployed
                relay.drop_streams()
                relay.stored(1, "e1", H[:1])
                await _until(sub, lambda: sub.streams == 2)
                assert sub.blocks.mismatch == "" and sub.blocks.match(H) == (8, 0)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_dns_pool_subscribes_to_each_address_as_its_membership_changes(monkeypatch: Any) -> None:
    from services.router.backends.kv_events import KvFeeds, grpc_address
    from services.router.backends.pool import build_pools
    from services.router.config import parse_config

    async def idle(self: KvSubscriber) -> None:  # no frontend here: the subscriptions only exist
        await asyncio.Event().wait()

    monkeypatch.setattr(KvSubscriber, "run", idle)
    config = parse_config({
        "listeners": [{"port": 1}],
        "pools": {"fe": {"model": "tiny", "tokenizer": "tiny", "policy": "precise_prefix",
                         "dns": {"name": "fe.svc", "port": 8000, "grpc_port": 50051}}},
        "entries": {"tiny": {"default": ["fe"]}}})
    pools = build_pools(config)
    pool = pools["fe"]

    async def go() -> None:
        feeds = KvFeeds(config, pools)
        pool.replace_replicas(["http://10.0.0.1:8000", "http://[fd00::2]:8000"])
        feeds.start()
        assert sorted(s.address for s in feeds.subscribers) == ["10.0.0.1:50051", "[fd00::2]:50051"]
        first = next(s for s in feeds.subscribers if s.url == "http://10.0.0.1:8000")
        pool.replace_replicas(["http://10.0.0.1:8000", "http://10.0.0.3:8000"])
        feeds.sync("fe")
        assert sorted(s.address for s in feeds.subscribers) == ["10.0.0.1:50051", "10.0.0.3:50051"]
        assert first in feeds.subscribers  # the address that stayed keeps its stream
        await feeds.stop()
        assert feeds.subscribers == []

    asyncio.run(go())
    assert grpc_address("http://fe-0.fe:8000", 9) == "fe-0.fe:9"
