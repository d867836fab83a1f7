"""The compose files run in containers for tests, as a user runs them (`python -m deploy.compose`), under a
project name of the test's own and free host ports; what podman says about the project's containers."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.compose.project import LABEL
from deploy.podman import Podman

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"


@dataclass
class ComposeFleet:
    project: str
    files: tuple[str, ...]
    env: dict[str, str]  # what `python -m deploy.compose` ran with: the token, the host ports
    podman: Podman
    up_output: str = ""
    up_done: float = 0.0  # time.time() when `up` returned

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.env['ROUTER_PORT']}"

    def cli(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        """`python -m deploy.compose -f ... -p PROJECT ARGS`, its output captured."""
        argv = [sys.executable, "-m", "deploy.compose", *(a for f in self.files for a in ("-f", str(COMPOSE / f))),
                "-p", self.project, *args]
        return subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def container(self, service: str) -> str:
        rows = self.ps(f"label=io.podman.compose.service={service}")
        assert len(rows) == 1, f"{service}: {rows}"
        return str(rows[0]["Names"][0])

    def inspect(self, service: str) -> dict[str, Any]:
        record = json.loads(self.podman.run("container", "inspect", self.container(service)).stdout)[0]
        assert isinstance(record, dict)
        return record

    def ps(self, *filters: str) -> list[dict[str, Any]]:
        """`podman ps -a` of this project's containers (and the other filters given)."""
        args = ["ps", "-a", "--format", "json", "--filter", f"label={LABEL}={self.project}"]
        for f in filters:
            args += ["--filter", f]
        rows = json.loads(self.podman.run(*args).stdout or "[]")
        assert isinstance(rows, list)
        return rows

    def leftovers(self) -> dict[str, list[str]]:
        """What of the project podman still holds: containers, pods, networks, volumes (by the project label)."""
        label = f"label={LABEL}={self.project}"
        found = {kind: self.podman.run(*cmd, "--filter", label, "--format", fmt).stdout.split()
                 for kind, cmd, fmt in (("containers", ["ps", "-a"], "{{.Names}}"),
                                        ("networks", ["network", "ls"], "{{.Name}}"),
                                        ("volumes", ["volume", "ls"], "{{.Name}}"))}
        # podman-compose labels no pod; its pod is named after the project
        found["pods"] = [n for n in self.podman.run("pod", "ps", "--format", "{{.Name}}").stdout.split()
                         if n == f"pod_{self.project}"]
        return found

    def exec_python(self, service: str, code: str) -> str:
        """Python run inside the service's container (its own interpreter, its own network view)."""
        done = self.podman.run("exec", self.container(service), "python", "-c", code, timeout_s=60, check=False)
        return done.stdout + done.stderr


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fleet_up(*files: str, project: str | None = None, timeout_s: float = 600) -> ComposeFleet:
    """`up -d --wait` of `files` under a fresh project name and free host ports; the fleet even when it
    failed (its `up_output` says why), so that the caller can take it down."""
    env = {**os.environ, "ENGINE_AUTH_TOKEN": secrets.token_hex(16), "ROUTER_PORT": str(free_port()),
           "ROUTER_OPS_PORT": str(free_port())}
    fleet = ComposeFleet(project or f"fleet-test-{secrets.token_hex(3)}", files, env, Podman.default())
    done = fleet.cli("up", "-d", "--wait", timeout_s=timeout_s)
    fleet.up_output = done.stdout + done.stderr
    fleet.up_done = time.time()
    if done.returncode != 0:
        fleet.cli("down", "-v", "-t", "5")
        raise RuntimeError(f"compose up failed ({done.returncode}):\n{fleet.up_output[-6000:]}")
    return fleet
