"""The frontend's socket thread over a real loopback connection: what it tells the loop when the
engine's socket goes away (the signal that marks a rank down before any heartbeat deadline)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

from services.frontend.bridge import CONNECTED, DEALER, DISCONNECTED, FLUSHED, SEND_FAILED, Bridge, Inbound


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
            bridge.send(0, [b"\x01\x02\x03", b"lost"])
            bridge.flush(0)
            await until(lambda: any(c == FLUSHED for _, c, _ in seen))
            after = [(c, f) for _, c, f in seen[[c for _, c, _ in seen].index(DISCONNECTED):]]
            assert (SEND_FAILED, [b"\x01\x02\x03", b"lost"]) in after  # never left: it can go elsewhere
            assert all(c != DEALER for c, _ in after)
        finally:
            await asyncio.to_thread(bridge.close)
            ctx.term()

    asyncio.run(main())
