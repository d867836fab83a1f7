from __future__ import annotations

import asyncio

from services.frontend.engines import EngineSet


def test_a_dead_socket_thread_fails_every_engine_at_once() -> None:
    async def main() -> None:
        # An address zmq refuses kills the socket thread at its first connect.
        engines = EngineSet(["bogus://nowhere", "tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60,
                            heartbeat_interval_s=1)
        engines.start()
        try:
            async with asyncio.timeout(5):
                while engines.broken is None:
                    await asyncio.sleep(0.01)
            assert "socket thread stopped" in engines.broken and "ZMQError" in engines.broken
            assert {e.state for e in engines.engines} == {"dead"}
            assert all("socket thread stopped" in reason for reason in engines.not_ready().values())
        finally:
            await engines.close()

    asyncio.run(main())
