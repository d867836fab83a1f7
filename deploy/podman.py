"""Podman on a host with no Docker engine, no systemd and no reachable image registry (this project's CI
and test machines): a storage root of the project's own, the flags such a host needs, and a local Debian
base image. Used by `make images`, `make compose-up` and the container tests; elsewhere use docker.

Why each setting (docs/deploy.md, "Building without Docker or a registry"): crun refuses the hybrid cgroup layout
these machines have, so runc; no systemd, so the cgroupfs manager; the default ulimits cannot be set
there, so none; overlay mounts are not allowed, so the vfs storage driver (every layer a full copy).
"""
from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "FLEET_PODMAN_ROOT"
BASE_IMAGE = "localhost/fleet-base:bookworm"
# What the Dockerfiles need of a base: python3 with its venv module, and CA certificates for pip.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""


class PodmanError(RuntimeError):
    """A podman command failed; the message carries the command and what it printed."""


@dataclass(frozen=True, slots=True)
class Podman:
    root: Path  # images, containers and the containers.conf live here and nowhere else

    @classmethod
    def default(cls) -> Podman:
        """$FLEET_PODMAN_ROOT, else ~/.cache/fleet/containers: kept between runs, so images build once."""
        root = os.environ.get(ROOT_ENV) or str(Path.home() / ".cache" / "fleet" / "containers")
        return cls(Path(root))

    @property
    def global_args(self) -> list[str]:
        return ["--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
                "--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]

    def env(self) -> dict[str, str]:
        """The environment every podman call (and podman-compose) runs with."""
        conf = self.root / "containers.conf"
        if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
            self.root.mkdir(parents=True, exist_ok=True)
            conf.write_text(CONTAINERS_CONF)
        return {**os.environ, "CONTAINERS_CONF": str(conf)}

    def argv(self, *args: str) -> list[str]:
        return [podman_binary(), *self.global_args, *args]

    def run(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """One podman command, its output captured; PodmanError (with that output) when it fails."""
        argv = self.argv(*args)
        try:
            done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise PodmanError(f"podman {' '.join(args)}: no answer in {timeout_s:g}s") from e
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)} exited {done.returncode}: "
                              f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def image_exists(self, name: str) -> bool:
        return self.run("image", "exists", name, check=False).returncode == 0

    def build(self, dockerfile: Path, tag: str, context: Path, base: str | None = None,
              timeout_s: float = 1800, *, build_args: Mapping[str, str] | None = None,
              volumes: Sequence[str] = (), layers: bool = False, quiet: bool = True) -> None:
        """`podman build` of one Dockerfile, FROM `base` when given (else the Dockerfile's default), with the
        host's CA bundle mounted so that pip inside the build can verify the package index.

        `build_args` are more --build-arg NAME=VALUE, `volumes` more -v SRC:DST[:ro] mounts for the build's
        RUN steps. `layers` False (podman's --layers=false) runs every step in one container and commits
        once: on vfs each committed step is a full copy of the image so far, and the test builds want no
        cache of intermediate steps. `quiet` False lets podman's output through to this process's own."""
        # Docker's image format: podman's default (OCI) has no HEALTHCHECK and drops it, with a warning.
        args = ["build", "--format", "docker", "-f", str(dockerfile), "-t", tag, f"--layers={str(layers).lower()}"]
        if base is not None:
            args += ["--build-arg", f"BASE={base}"]
        for name, value in (build_args or {}).items():
            args += ["--build-arg", f"{name}={value}"]
        bundle = ca_bundle()
        if bundle is not None:
            args += ["-v", f"{bundle}:{bundle}:ro"]
        for volume in volumes:
            args += ["-v", volume]
        args.append(str(context))
        if quiet:
            self.run(*args, timeout_s=timeout_s)
            return
        try:
            code = subprocess.run(self.argv(*args), env=self.env(), timeout=timeout_s).returncode
        except subprocess.TimeoutExpired as e:
            raise PodmanError(f"podman build -t {tag}: not done in {timeout_s:g}s") from e
        if code != 0:
            raise PodmanError(f"podman build -t {tag} exited {code} (its output is above)")

    def ensure_base(self, name: str = BASE_IMAGE, timeout_s: float = 600) -> str:
        """A Debian bookworm base with python3 built by mmdebstrap and imported, unless already there:
        the stand-in for `python:3.11-slim` where no registry can be reached. Returns its name."""
        if self.image_exists(name):
            return name
        mmdebstrap = shutil.which("mmdebstrap")
        if mmdebstrap is None:
            raise PodmanError("mmdebstrap is not installed (apt-get install mmdebstrap): it builds the local "
                              f"base image {name}")
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            tar = Path(tmp) / "base.tar"
            done = subprocess.run([mmdebstrap, "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
                                   "bookworm", str(tar)], capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise PodmanError(f"mmdebstrap exited {done.returncode}: {done.stderr.strip()[-2000:]}")
            self.run("import", str(tar), name, timeout_s=timeout_s)
        return name


def podman_binary() -> str:
    found = shutil.which("podman")
    if found is None:
        raise PodmanError("podman is not installed (apt-get install podman runc)")
    return found


def ca_bundle() -> Path | None:
    """The host's CA bundle, which a build mounts over its own: pip in a build reaches the package index
    through this host's certificate chain only with it."""
    paths = ssl.get_default_verify_paths()
    for candidate in (os.environ.get("SSL_CERT_FILE"), paths.cafile, paths.openssl_cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None
