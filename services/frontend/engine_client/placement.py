"""Data-parallel placement: pick the engine rank for a request.

score(rank) = (running + waiting from its latest Stats + requests we sent since) x DECODE_WEIGHT
              + our prompt tokens it has not started yet - prompt tokens it already caches.
Lowest score wins; ties rotate. X-Data-Parallel-Rank pins a rank. Each choice can be explained in
one debug line.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.frontend.engine_client.engines import Engine

log = logging.getLogger(__name__)

# A running sequence costs about this many prompt tokens of work per placement decision: it keeps
# decoding for a while, while a prompt token is computed once. A tunable, not a law.
DECODE_WEIGHT = 64


class NoEngine(RuntimeError):
    """No engine can take the request; the message says why. status: 503, or 400 for a pin to a rank
    that is not part of the deployment (the client's mistake)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Score:
    rank: int
    requests: int
    pending_prefill: int
    cached_tokens: int
    score: int


def _pinned(engines: Sequence[Engine], pinned: int) -> Engine:
    """The rank X-Data-Parallel-Rank names; NoEngine when it is not one, or cannot take requests now."""
    target = next((e for e in engines if e.rank == pinned), None)
    if target is None:
        raise NoEngine(f"X-Data-Parallel-Rank {pinned} is not a rank of this deployment "
                       f"(ranks: {sorted(e.rank for e in engines)})", 400)
    if not target.accepting:
        raise NoEngine(f"engine rank {pinned} (pinned by X-Data-Parallel-Rank) is not available: "
                       f"{target.unavailable}")
    return target


class Placement:
    def __init__(self) -> None:
        self._turn = 0

    def choose(self, engines: Sequence[Engine], prompt_len: int,
               block_hashes: Callable[[int], list[int]], *, pinned: int | None = None,
               request_id: str = "") -> tuple[Engine, int]:
        """The engine and how many prompt tokens it already caches (by our KV index)."""
        live = [e for e in engines if e.accepting]
        if pinned is not None:
            target = _pinned(engines, pinned)
            hashes = block_hashes(target.block_size) if target.kv.blocks else []
            return target, target.kv.cached_blocks(hashes) * target.block_size
        return self._chosen(engines, live, prompt_len, block_hashes, request_id)

    def pick(self, engines: Sequence[Engine], prompt_len: int,
             block_hashes: Callable[[int], list[int]], *, pinned: int | None = None,
             request_id: str = "") -> Engine:
        """choose()'s engine, without the prefix-cache lookup (hashing every block of the prompt) where it
        cannot change the choice: a pinned rank, or a single engine taking requests (unless the choice
        is to be explained in the debug log)."""
        if pinned is not None:
            return _pinned(engines, pinned)
        live = [e for e in engines if e.accepting]
        if len(live) == 1 and not log.isEnabledFor(logging.DEBUG):
            self._turn += 1
            return live[0]
        return self._chosen(engines, live, prompt_len, block_hashes, request_id)[0]

    def _chosen(self, engines: Sequence[Engine], live: list[Engine], prompt_len: int,
                block_hashes: Callable[[int], list[int]], request_id: str) -> tuple[Engine, int]:
        if not live:
            raise NoEngine("no engine is ready: " + "; ".join(f"rank {e.rank}: {e.unavailable}" for e in engines))
        scores = [self._score(e, prompt_len, block_hashes) for e in live]
        best = min(s.score for s in scores)
        tied = [i for i, s in enumerate(scores) if s.score == best]
        pick = tied[self._turn % len(tied)]
        self._turn += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("placed %s on rank %d (%s)", request_id, scores[pick].rank, "; ".join(
                f"rank {s.rank}: {s.requests} req x {DECODE_WEIGHT} + {s.pending_prefill} prefill "
                f"- {s.cached_tokens} cached = {s.score}" for s in scores) +
                (f"; tie of {len(tied)} rotated" if len(tied) > 1 else ""))
        return live[pick], scores[pick].cached_tokens

    @staticmethod
    def _score(e: Engine, prompt_len: int, block_hashes: Callable[[int], list[int]]) -> Score:
        requests = e.sent_since_stats + (e.stats.running + e.stats.waiting if e.stats else len(e.inflight))
        cached = 0
        if e.kv.blocks:
            cached = min(e.kv.cached_blocks(block_hashes(e.block_size)) * e.block_size, prompt_len)
        score = requests * DECODE_WEIGHT + e.pending_prefill + prompt_len - cached
        return Score(e.rank, requests, e.pending_prefill, cached, score)
