"""Embeddings for the recall plugins' unit tests: a text's vector counts its words, each hashed to one of
64 dimensions, L2-normalized. Texts with the same words are the same vector; texts sharing no word are
(almost always) orthogonal. Given to tests/support/fake_models.py's FakeModels as its `vectors`."""
from __future__ import annotations

import hashlib
import math
import re

DIMENSIONS = 64


class WordVectors(dict[str, list[float]]):
    """FakeModels.vectors for any text: computed on first use."""

    def __missing__(self, text: str) -> list[float]:
        vector = [0.0] * DIMENSIONS
        for word in re.findall(r"\w+", text.lower()):
            vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % DIMENSIONS] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]


def vector(text: str) -> tuple[float, ...]:
    return tuple(WordVectors()[text])
