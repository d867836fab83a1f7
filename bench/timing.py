"""Timing helpers shared by the bench scripts (run as `python bench/<name>.py`, so `bench/` is on sys.path)."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable


def per_call_us(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Median over `repeat` rounds of the mean microseconds per call of `fn`, called `n` times a round."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1); NaN for no values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan
