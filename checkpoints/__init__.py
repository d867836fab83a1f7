"""Resolve a ``--model`` value to a local checkpoint directory; ``"tiny"`` is a
random-weight Qwen3-architecture model built on first use and cached."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoints import tiny

__all__ = ["CheckpointError", "TINY", "cache_dir", "resolve"]

TINY = "tiny"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


class CheckpointError(ValueError):
    """A ``--model`` value that does not name a usable checkpoint."""


def cache_dir() -> Path:
    """``$FLEET_CACHE_DIR`` if set, else ``~/.cache/fleet``."""
    env = os.environ.get("FLEET_CACHE_DIR")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "fleet"


def resolve(model: str, *, weights: bool = False) -> Path:
    """Return the checkpoint directory for ``model``.

    ``weights=True`` also guarantees the weights exist: built for the tiny
    model, required to be present in a local directory.
    """
    if model == TINY:
        return tiny.ensure(cache_dir(), weights=weights)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"--model {model!r}: not a directory (and not {TINY!r})")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"--model {model!r}: directory has no config.json")
    if weights and not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        patterns = ", ".join(WEIGHT_PATTERNS)
        raise CheckpointError(f"--model {model!r}: directory has no weights ({patterns})")
    return path.resolve()
