"""Publish a generated checkpoint into the cache directory atomically: the
directory (config, tokenizer) appears by rename, the weights file by replace,
so concurrent builders in several processes never see a half-written one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["publish"]

Writer = Callable[[Path], None]


def publish(cache_dir: Path, dir_name: str, *, write_metadata: Writer, write_weights: Writer,
            weights_file: str, weights: bool) -> Path:
    """Return ``cache_dir/dir_name``, building what is missing.

    ``write_metadata(dir)`` writes everything but the weights; ``write_weights(path)`` writes the
    weights file, and runs only when ``weights`` is asked for: a process that reads only the
    tokenizer (a frontend) never pays for, or imports, the weight generator.
    """
    target = cache_dir / dir_name
    if not (target / "config.json").is_file():
        _publish_dir(cache_dir, target, write_metadata, write_weights if weights else None, weights_file)
    if weights and not (target / weights_file).is_file():
        _publish_weights(target, write_weights, weights_file)
    return target


def _publish_dir(cache_dir: Path, target: Path, write_metadata: Writer, write_weights: Writer | None,
                 weights_file: str) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=cache_dir))
    try:
        # mkdtemp/mkstemp create private (0700/0600) entries; the cache
        # may be shared, so give them ordinary permissions.
        tmp.chmod(0o755)
        write_metadata(tmp)
        if write_weights is not None:
            write_weights(tmp / weights_file)
        os.rename(tmp, target)
    except OSError:
        # Lost the race to another builder: its directory is complete
        # because it, too, appeared by rename.
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish_weights(target: Path, write_weights: Writer, weights_file: str) -> None:
    fd, name = tempfile.mkstemp(prefix=f".{weights_file}.", suffix=".tmp", dir=target)
    os.close(fd)
    try:
        write_weights(Path(name))
        # Concurrent writers produce identical bytes, so last one wins.
        os.replace(name, target / weights_file)
    finally:
        if os.path.exists(name):
            os.unlink(name)
