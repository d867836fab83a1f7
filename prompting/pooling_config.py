"""What a pooling checkpoint's files declare, read as transformers and vLLM read them: its class labels
(config.json's id2label) and its embedding size and Matryoshka support (vLLM's ModelConfig.embedding_size,
with sentence-transformers' Dense layers, is_matryoshka and matryoshka_dimensions). One reader for the
frontend and the sim engine, so that both agree; files only, read once per process at start."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompting.model_files import read_json

# transformers' PretrainedConfig: a config without id2label has num_labels (default 2) labels LABEL_i.
DEFAULT_NUM_LABELS = 2
# The modules.json types vLLM reads as Dense layers (its transformers_utils/config.py _DENSE_MODULE_TYPES).
_DENSE_TYPES = frozenset({"sentence_transformers.models.Dense", "sentence_transformers.base.modules.dense.Dense",
                          "pylate.models.Dense.Dense"})


def labels(config: Mapping[str, Any]) -> dict[int, str]:
    """config.json's id2label as transformers reads it (keys made integers); without one, `num_labels`
    labels named LABEL_0, LABEL_1, ..."""
    given = config.get("id2label")
    if isinstance(given, Mapping) and given:
        return {int(key): str(value) for key, value in given.items()}
    count = config.get("num_labels", DEFAULT_NUM_LABELS)
    return {i: f"LABEL_{i}" for i in range(count if isinstance(count, int) else DEFAULT_NUM_LABELS)}


@dataclass(slots=True, frozen=True)
class EmbeddingFacts:
    """The embedding size and Matryoshka support a checkpoint declares (vLLM's ModelConfig.embedding_size,
    is_matryoshka, matryoshka_dimensions)."""

    size: int | None
    matryoshka: bool
    dimensions: tuple[int, ...] | None  # the only sizes it may be cut to, when the config lists them

    @classmethod
    def of(cls, checkpoint: Path, config: Mapping[str, Any]) -> EmbeddingFacts:
        listed = config.get("matryoshka_dimensions")
        dims = tuple(d for d in listed if isinstance(d, int)) if isinstance(listed, list) and listed else None
        return cls(embedding_size(checkpoint, config), bool(dims) or config.get("is_matryoshka") is True, dims)


def embedding_size(checkpoint: Path, config: Mapping[str, Any]) -> int | None:
    """config.json's embedding_size, else the last sentence-transformers Dense layer's out_features (it
    projects the pooled vector: its width is the embedding's), else hidden_size; as vLLM's order."""
    for size in (config.get("embedding_size"), _dense_out_features(checkpoint), config.get("hidden_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None


def _dense_out_features(checkpoint: Path) -> int | None:
    """The last Dense module's out_features (modules.json, then that module's config.json); None without
    one, or when the files cannot be read (vLLM's try_get_dense_modules gives up the same way)."""
    path = checkpoint / "modules.json"
    try:
        modules = json.loads(path.read_text()) if path.is_file() else None  # a list, as sentence-transformers writes it
    except (OSError, ValueError):
        return None
    if isinstance(modules, dict):
        modules = modules.get("modules", [])
    width = None
    for module in modules if isinstance(modules, list) else ():
        if not isinstance(module, dict) or module.get("type") not in _DENSE_TYPES:
            continue
        folder = str(module.get("path", ""))
        try:
            layer = read_json(checkpoint / folder / "config.json" if folder else checkpoint / "config.json")
        except (OSError, ValueError):
            continue
        if layer:
            width = layer.get("out_features")
    return width if isinstance(width, int) else None
