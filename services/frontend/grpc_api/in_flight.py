"""The frontend's requests in flight on each engine rank, across its API servers (--api-server-count), for
Control.GetLoads: API server 0 alone serves gRPC, and each process has its own engine links. A shared
array (one row per API server, one column per rank) that every other API server writes its own row of
every PUBLISH_S; server 0 adds its live counts to the others' rows. No grpcio here: every API server
imports it."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext

PUBLISH_S = 0.1  # how stale another API server's counts may be (the engines' Stats come as often)


class InFlightBoard:
    """Made by API server 0 before it spawns the others, and handed to each in its arguments."""

    def __init__(self, ctx: SpawnContext, servers: int, ranks: int) -> None:
        self.servers, self.ranks = servers, ranks
        self._counts = ctx.RawArray("L", servers * ranks)  # shared memory; one writer per row, no lock needed

    def publish(self, server: int, counts: Sequence[int]) -> None:
        row = server * self.ranks
        for i, n in enumerate(counts):
            self._counts[row + i] = n

    def others(self, server: int, rank_index: int) -> int:
        """The in-flight requests of every API server but `server` on the rank at `rank_index`."""
        return sum(self._counts[s * self.ranks + rank_index] for s in range(self.servers) if s != server)

    async def keep_publishing(self, server: int, counts: Callable[[], Sequence[int]]) -> None:
        """Another API server's task: its row kept current until cancelled."""
        while True:
            self.publish(server, counts())
            await asyncio.sleep(PUBLISH_S)
