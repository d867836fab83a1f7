"""The fleet's three images and how podman builds them here: over the local Debian base (no registry),
engine-cpu with torch's CPU wheel from a local wheel directory when there is one, engine-cuda over the
engine-cpu image (no GPU host, no vLLM image). Run by `python -m deploy.images` and the container tests."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = Path(__file__).resolve().parent
WHEELS_ENV = "FLEET_TORCH_WHEELS"
# The order `all` builds them in: engine-cuda is built over engine-cpu here.
NAMES = ("slim", "engine-cpu", "engine-cuda")
# What a build copies in (.dockerignore's list, `COPY . /src`) and what decides what it copies.
INPUTS = (".dockerignore", "pyproject.toml", "setup.py", "README.md", "protocol", "services", "checkpoints",
          "prompting", "edge", "tracing")
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
        """Builds it and records what it was built from (up_to_date)."""
        digest = self.digest(podman)
        podman.build(self.dockerfile, self.tag, ROOT, base=self.base, build_args=self.build_args,
                     volumes=self.volumes, quiet=quiet, timeout_s=timeout_s)
        self.stamp(podman).write_text(digest)
        return self.tag

    def up_to_date(self, podman: Podman) -> bool:
        """The image is there, built from the inputs it would be built from now."""
        stamp = self.stamp(podman)
        return podman.image_exists(self.tag) and stamp.exists() and stamp.read_text() == self.digest(podman)

    def stamp(self, podman: Podman) -> Path:
        return podman.root / f"{self.name}.inputs"

    def digest(self, podman: Podman) -> str:
        """The Dockerfile, the base (the image itself when it is one of ours), the build args and every
        file the build copies in."""
        h = hashlib.sha256(self.dockerfile.read_bytes())
        h.update(self.base.encode())
        if self.base in TAGS.values():
            h.update(podman.run("image", "inspect", "--format", "{{.Id}}", self.base).stdout.encode())
        for name, value in sorted(self.build_args.items()):
            h.update(f"{name}={value}".encode())
        for name in INPUTS:
            path = ROOT / name
            files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and p.suffix != ".so") \
                if path.is_dir() else [path]
            for f in files:
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(f.read_bytes())
        return h.hexdigest()


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
