"""The fleet's images for container tests, built once per machine with podman (deploy/podman.py) from the
local base and rebuilt when their inputs change; a file lock keeps two xdist workers from building the
same image at once."""
from __future__ import annotations

import hashlib
from pathlib import Path

from filelock import FileLock

from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "deploy" / "images"
SLIM = "ghcr.io/fleet/fleet-slim:0.1.0"
# What a build copies in (the Dockerfile's COPY lines and the Dockerfile itself): a change to any of
# them makes the image stale.
_INPUTS = ("pyproject.toml", "README.md", "protocol", "services", "checkpoints", "prompting", "edge", "tracing")


def podman() -> Podman:
    return Podman.default()


def image(name: str, tag: str, timeout_s: float = 1800) -> str:
    """`tag` built from deploy/images/<name>.Dockerfile over the local base, unless an image of that tag
    built from the same inputs is already there. Returns the tag."""
    pm = podman()
    pm.root.mkdir(parents=True, exist_ok=True)
    dockerfile = DOCKERFILES / f"{name}.Dockerfile"
    digest = _digest(dockerfile)
    stamp = pm.root / f"{name}.inputs"
    with FileLock(str(pm.root / f"{name}.lock"), timeout=timeout_s):
        if pm.image_exists(tag) and stamp.exists() and stamp.read_text() == digest:
            return tag
        pm.build(dockerfile, tag, ROOT, base=pm.ensure_base(), timeout_s=timeout_s)
        stamp.write_text(digest)
    return tag


def slim() -> str:
    return image("slim", SLIM)


def _digest(dockerfile: Path) -> str:
    h = hashlib.sha256(dockerfile.read_bytes())
    for name in _INPUTS:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()
