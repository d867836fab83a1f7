"""Round-robin policy (router process): the least recently assigned candidate, which rotates through
the pool and skips full or unready replicas without a counter to fix up. A baseline for benchmarks.
"""
from __future__ import annotations

from typing import Any

from services.router.backends.replica import Replica


def _last_assigned(r: Replica) -> float:
    return r.last_assigned


class RoundRobin:
    __slots__ = ("last_reason",)
    reads_body = False

    def __init__(self) -> None:
        self.last_reason = ""

    async def prepare(self, body: dict[str, Any], size: int) -> None:
        return None

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None,
               prepared: object = None) -> Replica:
        best = min(candidates, key=_last_assigned)
        self.last_reason = f"round_robin: least recently assigned -> {best.url}"
        return best

    def on_assigned(self, replica: Replica, text: str | None, prepared: object = None) -> None:
        pass

    def on_removed(self, url: str) -> None:
        pass
