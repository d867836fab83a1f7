"""The sim's logprobs: a fixed fake distribution, so logprobs, prompt_logprobs and their packing can be
exercised end to end without a model. Runs in the sim engine process.

Whatever came before it, a position whose own token (sampled or prompt) is t has: t ranked 1 + t % 4;
the rank-j token t itself when j is t's rank, else (t + j) % vocab; and the rank-j logprob -j ln 2
(probability 2^-j). Not a model's numbers, but consistent ones: the token's logprob is its rank's, and
it is among its top-k alternatives exactly when its rank is at most k.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np

from protocol import PackedLogprobs
from services.engine.backend import Segment

_LN2 = math.log(2.0)


class FakeLogprobs:
    __slots__ = ("_formats", "_rows", "_vocab")

    def __init__(self, vocab_size: int) -> None:
        self._vocab = vocab_size
        self._formats: dict[int, struct.Struct] = {}
        self._rows: dict[int, list[tuple[float, ...]]] = {}  # per k, per rank 1..4: the row's logprobs

    @staticmethod
    def rank(token: int) -> int:
        return 1 + token % 4

    def segment(self, tokens: Sequence[int], k: int) -> Segment:
        """Rows for `tokens` (one per position) with k alternatives each."""
        if len(tokens) == 1:
            return self._one(tokens[0], k)
        t = np.asarray(tokens, dtype=np.int64)[:, None]
        r = 1 + t % 4
        j = np.arange(1, k + 1)[None, :]
        ids = np.concatenate([t, np.where(j == r, t, (t + j) % self._vocab)], axis=1)
        lps = np.concatenate([r, np.broadcast_to(j, (len(tokens), k))], axis=1) * -_LN2
        # C order, which a concatenation with a broadcast array need not give.
        parts = [np.ascontiguousarray(a, dtype=dt).data for a, dt in ((ids, "<i4"), (lps, "<f4"), (r[:, 0], "<i4"))]
        return PackedLogprobs(0, 0, len(tokens), k), parts

    def _one(self, token: int, k: int) -> Segment:
        """A generated token's row, as one struct.pack: this runs per token."""
        fmt = self._formats.get(k)
        if fmt is None:
            fmt = self._formats[k] = struct.Struct(f"<{k + 1}i{k + 1}fi")
            self._rows[k] = [(-r * _LN2, *(-j * _LN2 for j in range(1, k + 1))) for r in range(1, 5)]
        r = 1 + token % 4
        vocab = self._vocab
        ids = [token if j == r else (token + j) % vocab for j in range(1, k + 1)]
        return PackedLogprobs(0, 0, 1, k), [fmt.pack(token, *ids, *self._rows[k][r - 1], r)]
