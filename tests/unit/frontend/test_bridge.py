"""The frontend's socket thread over a real loopback connection: what it tells the loop when the
engine's socket goes away (the signal that marks a rank down before any heartbeat deadline)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import zmq

from protocol import AllCleared, BlockRemoved, BlockStored, Outputs, Stats
from protocol.version import MAJOR, MINOR
from services.frontend.engine_client.bridge import (
    CONNECTED,
    DEALER,
    DISCONNECTED,
    FLUSHED,
    SEND_FAILED,
    SUB,
    Bridge,
    Inbound,
)


def test_a_closed_engine_socket_is_told_at_once_and_later_sends_come_back_refused() -> None:
    async def main() -> None:
        ctx = zmq.Context()
        engine = ctx.socket(zmq.ROUTER)
        engine.setsockopt(zmq.LINGER, 0)
        port = engine.bind_to_random_port("tcp://127.0.0.1")
        seen: list[Inbound] = []
        arrived = asyncio.Event()

        def on_batch(batch: list[Inbound], received_at: float) -> None:
            seen.extend(batch)
            arrived.set()

        async def until(ok: Callable[[], bool]) -> None:
            async with asyncio.timeout(10):
                while not ok():
                    arrived.clear()
                    await arrived.wait()

        bridge = Bridge(asyncio.get_running_loop(), on_batch, "fe")
        try:
            bridge.connect(0, f"tcp://127.0.0.1:{port}")
            await until(lambda: any(c == CONNECTED for _, c, _ in seen))
            bridge.send(0, [b"\x01\x02\x03", b"hello"])
            assert await asyncio.to_thread(engine.poll, 5000)
            assert engine.recv_multipart()[1:] == [b"\x01\x02\x03", b"hello"]

            engine.close()  # as when the engine process dies: the kernel closes its connections
            await until(lambda: any(c == DISCONNECTED for _, c, _ in seen))
            # ZMQ may tell the disconnect a moment before it drops the connection's pipe; a send in that
            # moment is lost (the frontend stops placing on the rank at DISCONNECTED). From then on every
            # send comes back refused: it never left, so it can go elsewhere.
            async with asyncio.timeout(5):
                while not any(c == SEND_FAILED and f[-1] == b"lost" for _, c, f in seen):
                    flushed = sum(c == FLUSHED for _, c, _ in seen)
                    bridge.send(0, [b"\x01\x02\x03", b"lost"])
                    bridge.flush(0)
                    await until(lambda n=flushed: sum(c == FLUSHED for _, c, _ in seen) > n)  # type: ignore[misc]
            after = [(c, f) for _, c, f in seen[[c for _, c, _ in seen].index(DISCONNECTED):]]
            assert all(c != DEALER for c, _ in after)
        finally:
            await asyncio.to_thread(bridge.close)
            ctx.term()

    asyncio.run(main())


async def _peer(bridge: Bridge, engine: zmq.Socket, port: int, connected: asyncio.Event) -> bytes:
    """Connect the bridge to the engine's ROUTER and send one message: the bridge's identity there."""
    bridge.connect(0, f"tcp://127.0.0.1:{port}")
    async with asyncio.timeout(10):
        await connected.wait()
    bridge.send(0, [b"\x01\x02\x03", b"hello"])
    assert await asyncio.to_thread(engine.poll, 5000)
    peer: bytes = engine.recv_multipart()[0]
    return peer


def test_stats_alone_wait_for_company_and_anything_else_brings_them_at_once() -> None:
    """idle_hold: a batch of nothing but Stats reaches the loop after hold_stats_s (with the time it was
    read), unless something else comes first, which brings the held Stats with it, ahead of it."""
    stats = [bytes((MAJOR, MINOR, Stats.TAG)), b"s"]
    other = [bytes((MAJOR, MINOR, Outputs.TAG)), b"o"]

    async def main() -> None:
        ctx = zmq.Context()
        engine = ctx.socket(zmq.ROUTER)
        engine.setsockopt(zmq.LINGER, 0)
        port = engine.bind_to_random_port("tcp://127.0.0.1")
        calls: list[tuple[float, float, list[Inbound]]] = []  # (handed at, read at, batch)
        arrived = asyncio.Event()

        connected = asyncio.Event()

        def on_batch(batch: list[Inbound], received_at: float) -> None:
            calls.append((time.monotonic(), received_at, [item for item in batch if item[1] == DEALER]))
            if any(c == CONNECTED for _, c, _ in batch):
                connected.set()
            arrived.set()

        bridge = Bridge(asyncio.get_running_loop(), on_batch, "fe", hold_stats_s=0.3)
        try:
            peer = await _peer(bridge, engine, port, connected)
            await asyncio.sleep(0.1)
            calls.clear()
            sent = time.monotonic()
            engine.send_multipart([peer, *stats])
            async with asyncio.timeout(5):
                while not any(batch for _, _, batch in calls):
                    arrived.clear()
                    await arrived.wait()
            [(handed, read, batch)] = [c for c in calls if c[2]]
            assert [f for _, _, f in batch] == [stats] and handed - sent >= 0.25 and read <= handed
            calls.clear()
            engine.send_multipart([peer, *stats])
            await asyncio.sleep(0.05)
            engine.send_multipart([peer, *other])
            async with asyncio.timeout(5):
                while sum(len(batch) for _, _, batch in calls) < 2:
                    arrived.clear()
                    await arrived.wait()
            frames = [f for _, _, batch in calls for _, _, f in batch]
            assert frames == [stats, other] and calls[-1][0] - sent < 5  # no hold: the output brought them
            assert all(handed - read < 0.25 for handed, read, b in calls if b and b[-1][2] == other)
        finally:
            await asyncio.to_thread(bridge.close)
            engine.close()
            ctx.term()

    asyncio.run(main())


def test_a_quiet_frontend_reads_its_engines_twice_a_second_and_still_sees_a_closed_one_at_once() -> None:
    """quiet (nothing in flight, no reply awaited): the engines' sockets are read every hold_stats_s, so
    Stats every 50 ms reach the loop in a few batches, every one of them; a closed connection is still
    told at once (the monitors are polled), and a command has the sockets read when it wakes the thread."""
    stats = [bytes((MAJOR, MINOR, Stats.TAG)), b"s"]

    async def main() -> None:
        ctx = zmq.Context()
        engine = ctx.socket(zmq.ROUTER)
        engine.setsockopt(zmq.LINGER, 0)
        port = engine.bind_to_random_port("tcp://127.0.0.1")
        calls: list[tuple[float, list[Inbound]]] = []
        connected = asyncio.Event()

        def on_batch(batch: list[Inbound], received_at: float) -> None:
            calls.append((time.monotonic(), batch))
            if any(c == CONNECTED for _, c, _ in batch):
                connected.set()

        bridge = Bridge(asyncio.get_running_loop(), on_batch, "fe", hold_stats_s=0.4)
        try:
            peer = await _peer(bridge, engine, port, connected)
            bridge.quiet = True
            await asyncio.sleep(0.5)
            calls.clear()
            for _ in range(24):  # 1.2 s of Stats every 50 ms
                engine.send_multipart([peer, *stats])
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            delivered = [item for _, batch in calls for item in batch if item[1] == DEALER]
            assert len(delivered) == 24 and 2 <= len(calls) <= 5, [len(b) for _, b in calls]
            calls.clear()
            engine.send_multipart([peer, *stats])
            await asyncio.sleep(0.05)
            sent = time.monotonic()
            bridge.send(0, [b"\x01\x02\x03", b"beat"])  # a command wakes the thread: it reads the sockets too
            async with asyncio.timeout(5):
                while not any(item[1] == DEALER for _, batch in calls for item in batch):
                    await asyncio.sleep(0.01)
            assert calls[-1][0] - sent < 0.2
            closed = time.monotonic()
            engine.close()
            async with asyncio.timeout(5):
                while not any(item[1] == DISCONNECTED for _, batch in calls for item in batch):
                    await asyncio.sleep(0.01)
            assert time.monotonic() - closed < 0.3
        finally:
            await asyncio.to_thread(bridge.close)
            ctx.term()

    asyncio.run(main())


def test_an_engine_pub_brings_its_kv_events_of_any_minor_and_not_its_stats() -> None:
    """Every Stats also comes direct (the DEALER); the PUB's copies of a busy engine (one a step) would
    wake the socket thread a second time a step for nothing. KV events of a newer minor still come."""
    stats = [bytes((MAJOR, MINOR, Stats.TAG)), b"s"]
    stored = [bytes((MAJOR, MINOR, BlockStored.TAG)), b"k"]
    newer = [bytes((MAJOR, MINOR + 1, BlockRemoved.TAG)), b"k2"]
    cleared = [bytes((MAJOR, 0, AllCleared.TAG)), b"k3"]

    async def main() -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        seen: list[list[bytes]] = []

        def on_batch(batch: list[Inbound], received_at: float) -> None:
            seen.extend(f for _, c, f in batch if c == SUB)

        bridge = Bridge(asyncio.get_running_loop(), on_batch, "fe")
        try:
            bridge.subscribe(0, f"tcp://127.0.0.1:{port}")
            async with asyncio.timeout(10):  # until the subscriptions reached the PUB (a slow joiner)
                while not seen:
                    pub.send_multipart(stored)
                    await asyncio.sleep(0.02)
            seen.clear()
            for frames in (stats, newer, stats, cleared, stats):
                pub.send_multipart(frames)
            async with asyncio.timeout(10):
                while len(seen) < 2:
                    await asyncio.sleep(0.01)
            pub.send_multipart(stored)  # after the last Stats: once it is here, that Stats would have been too
            async with asyncio.timeout(10):
                while len(seen) < 3:
                    await asyncio.sleep(0.01)
            assert seen == [newer, cleared, stored]
        finally:
            await asyncio.to_thread(bridge.close)
            pub.close()
            ctx.term()

    asyncio.run(main())
