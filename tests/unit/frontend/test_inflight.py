"""engine_client/inflight.py: a stream_interval's chunks hold `interval` tokens each (but the first and
the last), also when the consumer runs late and takes tokens fed after its wake-up."""
from __future__ import annotations

import asyncio

from protocol import RequestOutput
from services.frontend.engine_client.inflight import InFlight


def test_a_late_consumer_does_not_make_the_next_chunk_short() -> None:
    async def go() -> list[int]:
        stream = InFlight("r", 4, 64)
        stream.interval = 3
        sizes: list[int] = []
        fed = 0

        def feed(n: int, last: int = 20) -> None:
            nonlocal fed
            for _ in range(n):
                fed += 1
                stream.feed(RequestOutput("r", [fed], "length" if fed == last else None))

        async def consume() -> None:
            while True:
                batch = await stream.next()
                sizes.append(sum(len(o.new_token_ids) for o in batch))
                if batch[-1].finish_reason is not None:
                    return

        async def let_it_run() -> None:
            for _ in range(5):  # the consumer's wake-up and its step: a few turns of the loop, no time
                await asyncio.sleep(0)

        consumer = asyncio.get_running_loop().create_task(consume())
        await let_it_run()
        feed(1)  # the first token: sent at once
        await let_it_run()
        feed(4)  # woken at the 3rd, the consumer runs late and takes the 4th too
        await let_it_run()
        feed(2)  # 2 since it took: not yet a chunk (woken here, it sent 2)
        await let_it_run()
        feed(13)
        await asyncio.wait_for(consumer, 5)
        return sizes

    sizes = asyncio.run(go())
    assert sizes[:2] == [1, 4] and sum(sizes) == 20
    assert all(size >= 3 for size in sizes[1:-1]), sizes
