"""One utility call on several engine ranks at once, and which of them refused it and why: written once
for the LoRA registry (lora.py) and gRPC's Control and RlControl. Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, TypeGuard

from protocol import UtilityResult


class _Rank(Protocol):
    index: int
    rank: int
    state: str


class UtilityPort(Protocol):
    """The engines as a fan-out sees them (engines.EngineSet)."""

    @property
    def engines(self) -> Sequence[_Rank]: ...

    async def utility(self, rank: int, utility: str, args: dict[str, Any] | None = None, timeout_s: float = 10.0,
                      frames: Sequence[bytes] = ()) -> UtilityResult: ...


def ready_ranks(engines: UtilityPort) -> list[int]:
    """The indexes (into `engines.engines`) of the ready ranks."""
    return [e.index for e in engines.engines if e.state == "ready"]


async def call_each(engines: UtilityPort, indexes: Sequence[int], utility: str, args: dict[str, Any],
                    timeout_s: float, frames: Sequence[bytes] = ()) -> list[UtilityResult | BaseException]:
    """`utility` on each of `indexes` at once, every answer awaited; a rank's error or time-out is its result."""
    return await asyncio.gather(*(engines.utility(i, utility, args, timeout_s, frames) for i in indexes),
                                return_exceptions=True)


def ok(result: UtilityResult | BaseException) -> TypeGuard[UtilityResult]:
    return not isinstance(result, BaseException) and result.ok


def why(result: UtilityResult | BaseException) -> str:
    """Why a rank's answer is not ok."""
    if isinstance(result, TimeoutError):
        return "no answer in time"
    if isinstance(result, BaseException):
        return repr(result)
    return result.error or "failed"


def refusals(engines: UtilityPort, indexes: Sequence[int],
             results: Sequence[UtilityResult | BaseException]) -> list[tuple[int, str]]:
    """Each rank (its rank number) that did not answer ok, and why; empty when all did."""
    return [(engines.engines[i].rank, why(r)) for i, r in zip(indexes, results, strict=True) if not ok(r)]


def told(failed: Sequence[tuple[int, str]]) -> str:
    """The refusals in one message: `engine rank N: why; ...`."""
    return "; ".join(f"engine rank {rank}: {reason}" for rank, reason in failed)
