"""The sim backend's pooled outputs: deterministic values computed from a request's token ids alone (the
same ids give the same vector on every run and host; the values mean nothing), shaped and activated as
vLLM's poolers shape them, so routing tests run without a model. Runs in the engine process.
"""
from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from hashlib import shake_256

from protocol import PoolingParams
from services.engine.backend import RequestRejected

DEFAULT_HIDDEN_SIZE = 384  # all-MiniLM-L6-v2's, for a checkpoint whose config does not say
LOGIT_SCALE = 4.0  # raw class logits lie in [-4, 4): softmax over them is neither flat nor one-hot
_U32 = 2.0**32


class SimPooler:
    """embed: one L2-normalized vector of hidden_size values; classify: softmax over num_labels logits
    (sigmoid for one label, as vLLM's cross-encoder score); token_embed / token_classify: one such row per
    prompt token. use_activation False gives the raw values; dimensions truncates an embedding (before
    normalizing, as vLLM's matryoshka) and is refused, as vLLM refuses it, unless the checkpoint's config
    says the model is matryoshka."""

    def __init__(self, *, model: str, hidden_size: int, num_labels: int, seed: int = 0,
                 matryoshka: bool = False, matryoshka_dimensions: Sequence[int] | None = None) -> None:
        if hidden_size < 1 or num_labels < 1:
            raise ValueError(f"hidden_size and num_labels must be >= 1, got {hidden_size} and {num_labels}")
        self.model = model
        self.hidden_size = hidden_size
        self.num_labels = num_labels
        self.matryoshka = matryoshka or bool(matryoshka_dimensions)
        self.matryoshka_dimensions = tuple(matryoshka_dimensions) if matryoshka_dimensions else None
        self._key = b"fleet-sim-pooler\0" + seed.to_bytes(8, "little")

    def check(self, params: PoolingParams) -> None:
        """Refuse `dimensions` the model cannot honour, with vLLM's messages (its PoolingParams.verify)."""
        dims = params.dimensions
        if dims is None:
            return
        if not self.matryoshka:
            raise RequestRejected(f"pooling.dimensions: Model {self.model!r} does not support Matryoshka "
                                  f"embeddings; dimensions must be unset (received dimensions={dims}).")
        if not 1 <= dims <= self.hidden_size:
            raise RequestRejected(f"pooling.dimensions: Model {self.model!r} only supports dimensions in range "
                                  f"[1, {self.hidden_size}], got {dims}.")
        mds = self.matryoshka_dimensions
        if mds is not None and dims not in mds:
            raise RequestRejected(f"pooling.dimensions: Model {self.model!r} only supports Matryoshka "
                                  f"dimensions {list(mds)}, got {dims}.")

    def pool(self, params: PoolingParams, token_ids: Sequence[int]) -> tuple[list[float], list[int]]:
        """The flat float values and their shape ([width] or [tokens, width]) of a checked request."""
        task = params.task
        per_token = task.startswith("token_")
        embed = task in ("embed", "token_embed")
        width = self.hidden_size if embed else self.num_labels
        rows = len(token_ids) if per_token else 1
        raw = self._raw(params, token_ids, rows * width)
        scale = 1.0 if embed else LOGIT_SCALE
        activate = params.use_activation is not False  # None: the model's default, which is on
        keep = params.dimensions if embed and params.dimensions is not None else width
        values: list[float] = []
        for r in range(rows):
            row = [scale * (u / _U32 * 2.0 - 1.0) for u in raw[r * width:r * width + keep]]
            if activate:
                row = _normalize(row) if embed else _softmax(row)
            values.extend(row)
        return values, ([rows, keep] if per_token else [keep])

    def _raw(self, params: PoolingParams, token_ids: Sequence[int], n: int) -> array[int]:
        """n pseudo-random uint32 from the ids (and a pair's split, and the task family: an embedding and a
        class score of the same text are unrelated), stable across processes (no hash(), no PRNG state)."""
        family = b"embed" if params.task in ("embed", "token_embed") else b"classify"
        split = params.token_type_split if params.token_type_split is not None else -1
        h = shake_256(self._key + family + split.to_bytes(8, "little", signed=True))
        h.update(array("q", token_ids).tobytes())
        out = array("I", h.digest(4 * n))
        assert out.itemsize == 4
        return out


def _normalize(row: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(v * v for v in row))
    return [v / norm for v in row] if norm > 0 else row


def _softmax(row: list[float]) -> list[float]:
    if len(row) == 1:  # one label: a probability of its own (vLLM's cross-encoder score)
        return [1.0 / (1.0 + math.exp(-row[0]))]
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    total = math.fsum(exps)
    return [e / total for e in exps]
