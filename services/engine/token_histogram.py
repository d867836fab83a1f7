"""vLLM's vllm:iteration_tokens_total for one rank, kept by the engine core loop: steps counted per bucket
of their tokens, cumulative since the engine started, sent in every Stats (protocol 1.4)."""
from __future__ import annotations

from bisect import bisect_left

from protocol import ITERATION_TOKENS_BUCKETS


class TokenHistogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        # counts[i]: steps with at most ITERATION_TOKENS_BUCKETS[i] tokens (and more than the bucket
        # before it); the last entry, steps above every bucket. Prometheus' `le` is inclusive.
        self.counts = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
        self.total = 0

    def observe(self, tokens: int) -> None:
        self.counts[bisect_left(ITERATION_TOKENS_BUCKETS, tokens)] += 1
        self.total += tokens
