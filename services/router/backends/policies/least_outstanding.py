"""Least-outstanding policy (router process): the replica with the fewest request bytes sent and not
yet finished, ties to the least recently assigned. The pool's default, as DESIGN.md's Router asks.
"""
from __future__ import annotations

from typing import Any

from services.router.backends.replica import Replica


def _load(r: Replica) -> tuple[int, float]:
    return r.outstanding_bytes, r.last_assigned


class LeastOutstanding:
    __slots__ = ("last_reason",)
    reads_body = False

    def __init__(self) -> None:
        self.last_reason = ""

    async def prepare(self, body: dict[str, Any], size: int) -> None:
        return None

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None,
               prepared: object = None) -> Replica:
        # Bytes, not request counts: a 100 kB prompt costs its replica far more prefill than a
        # 1 kB one, and bytes are known before any tokenizer runs.
        best = min(candidates, key=_load)
        tied = sum(1 for r in candidates if r.outstanding_bytes == best.outstanding_bytes)
        self.last_reason = (f"least_outstanding: {best.outstanding_bytes} outstanding bytes"
                            + (f" (tie of {tied}, least recently assigned)" if tied > 1 else "")
                            + f" -> {best.url}")
        return best

    def on_assigned(self, replica: Replica, text: str | None, prepared: object = None) -> None:
        pass

    def on_removed(self, url: str) -> None:
        pass
