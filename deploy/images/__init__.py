"""The fleet's three images and how podman builds them here: over the local Debian base (no registry),
engine-cpu with torch's CPU wheel from a local wheel directory when there is one, engine-cuda over the
engine-cpu image (no GPU host, no vLLM image). Run by `python -m deploy.images` and the container tests."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = Path(__file__).resolve().parent
WHEELS_ENV = "FLEET_TORCH_WHEELS"
# The order `all` builds them in: engine-cuda is built over engine-cpu here.
NAMES = ("slim", "engine-cpu", "engine-cuda")
TAGS = {"slim": "ghcr.io/fleet/fleet-slim:0.1.0", "engine-cpu": "ghcr.io/fleet/fleet-engine-cpu:0.1.0",
        "engine-cuda": "ghcr.io/fleet/fleet-engine-cuda:0.1.0"}


@dataclass(frozen=True, slots=True)
class Recipe:
    """One `podman build` of one image on this host."""

    name: str  # slim, engine-cpu, engine-cuda
    base: str  # what FROM ${BASE} becomes
    build_args: dict[str, str] = field(default_factory=dict)
    volumes: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return TAGS[self.name]

    @property
    def dockerfile(self) -> Path:
        return DOCKERFILES / f"{self.name}.Dockerfile"

    def build(self, podman: Podman, quiet: bool = True, timeout_s: float = 3600) -> str:
        podman.build(self.dockerfile, self.tag, ROOT, base=self.base, build_args=self.build_args,
                     volumes=self.volumes, quiet=quiet, timeout_s=timeout_s)
        return self.tag


def recipe(name: str, podman: Podman, wheels: Path | None = None) -> Recipe:
    """How `name` builds here. `wheels`: a directory holding torch's CPU wheel, mounted into the
    engine-cpu build at the same path (default: torch_wheels()); without one, pip in the build takes torch
    from PyTorch's CPU index, as a user's `docker build` does."""
    if name not in TAGS:
        raise ValueError(f"image: {name!r} is not one of {', '.join(NAMES)}")
    if name == "engine-cuda":
        # vLLM's CUDA image cannot be pulled here; the engine-cpu image has vllm and python3 too, so every
        # step after FROM runs for real (what stays unchecked: docs/deploy.md, "Images").
        return Recipe(name, TAGS["engine-cpu"])
    base = podman.ensure_base()
    if name == "slim":
        return Recipe(name, base)
    wheels = wheels or torch_wheels()
    if wheels is None:
        return Recipe(name, base)
    return Recipe(name, base, {"TORCH_FROM": f"--find-links {wheels}"}, (f"{wheels}:{wheels}:ro",))


def torch_wheels() -> Path | None:
    """$FLEET_TORCH_WHEELS, else the first of pip's --find-links directories ($PIP_FIND_LINKS) that holds
    a torch CPU wheel: where this host's own pip takes torch from when PyTorch's index is out of reach."""
    candidates = [os.environ.get(WHEELS_ENV, "")] + os.environ.get("PIP_FIND_LINKS", "").split()
    for candidate in filter(None, candidates):
        path = Path(candidate)
        if path.is_dir() and any(path.glob("torch-*+cpu-*.whl")):
            return path.resolve()
    return None
