"""One compose project on podman: podman-compose for what it does well (merging and interpolating the
files, creating the pod, network, volumes and containers, logs, ps, down), with this host's podman
settings (deploy/podman.py), and the start order it does not apply on podman < 4.6 (`depends_on`
conditions; plan.py, health.py) done here. Run by `python -m deploy.compose`."""
from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from deploy.compose import health
from deploy.compose.plan import Plan, plan_of
from deploy.podman import Podman, PodmanError, podman_binary

LABEL = "io.podman.compose.project"


class ComposeError(RuntimeError):
    """A compose step failed; the message says which and what podman or podman-compose printed."""


@dataclass(frozen=True, slots=True)
class Project:
    files: tuple[Path, ...]
    name: str | None  # -p; else the files' `name:`, else the first file's directory (as podman-compose does)
    podman: Podman
    say: Callable[[str], None] = print

    # --- podman-compose ---------------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        """podman-compose with this host's podman flags (--podman-args go to every podman call it makes)."""
        argv = [*_podman_compose(), "--podman-path", podman_binary(),
                "--podman-args", shlex.join(self.podman.global_args)]
        for f in self.files:
            argv += ["-f", str(f)]
        return [*argv, "-p", self.project_name(), *args]

    def compose(self, *args: str, capture: bool = True, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        """One podman-compose command (its output captured unless `capture` is False)."""
        done = subprocess.run(self.argv(*args), env=self.podman.env(), capture_output=capture, text=True,
                              timeout=timeout_s)
        if done.returncode != 0:
            shown = f": {(done.stderr or done.stdout or '').strip()[-3000:]}" if capture else ""
            raise ComposeError(f"podman-compose {' '.join(args)} exited {done.returncode}{shown}")
        return done

    def model(self) -> dict[str, object]:
        """The merged, interpolated model of the files (`podman-compose config`)."""
        argv = [*_podman_compose(), "--podman-path", podman_binary(),
                *(a for f in self.files for a in ("-f", str(f))), "config"]
        done = subprocess.run(argv, env=self.podman.env(), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ComposeError(f"podman-compose config exited {done.returncode}: {done.stderr.strip()[-3000:]}")
        model = yaml.safe_load(done.stdout)
        if not isinstance(model, dict):
            raise ComposeError(f"podman-compose config printed no model: {done.stdout[:500]!r}")
        return model

    def project_name(self) -> str:
        if self.name:
            return self.name
        name = yaml.safe_load(self.files[0].read_text()).get("name") if self.files else None
        return str(name) if name else self.files[0].resolve().parent.name

    # --- what runs --------------------------------------------------------------------------------

    def containers(self) -> dict[str, list[str]]:
        """service -> its container names, of every container of this project (running or not)."""
        rows = json.loads(self.podman.run("ps", "-a", "--filter", f"label={LABEL}={self.project_name()}",
                                          "--format", "json").stdout or "[]")
        found: dict[str, list[str]] = {}
        for row in rows:
            service = (row.get("Labels") or {}).get("io.podman.compose.service", "")
            found.setdefault(service, []).extend(row.get("Names") or [])
        return {service: sorted(names) for service, names in found.items()}

    # --- up ---------------------------------------------------------------------------------------

    def up(self, wait: bool = False) -> Plan:
        """Create everything, then start the services level by level, each once its dependencies meet their
        `depends_on` condition; with `wait`, until every service with a healthcheck is healthy too."""
        t0 = time.monotonic()
        plan = plan_of(self.model())
        missing = [f"{s.image} (service {s.name})" for s in plan.services.values()
                   if s.image and not s.built and not self.podman.image_exists(s.image)]
        if missing:
            raise ComposeError(f"image not here: {', '.join(missing)}; no registry is reachable from this host, "
                               "so build it first (`make images`; docs/deploy.md, Images)")
        self.compose("up", "--no-start")
        names = self.containers()
        checks = health.checks(self.podman, [n for ns in names.values() for n in ns])
        self.say(f"created {len(checks)} containers of project {self.project_name()} "
                 f"({time.monotonic() - t0:.1f} s)")
        met: set[tuple[str, str]] = set()
        for level in plan.levels():
            gates = {(dep, cond) for service in level for dep, cond in plan.services[service].depends_on.items()}
            self._meet(gates - met, names, checks, t0)
            met |= gates
            to_start = [n for service in level for n in names.get(service, [])]
            self.podman.run("start", *to_start)
            self.say(f"started {', '.join(level)} ({time.monotonic() - t0:.1f} s)")
        if wait:
            last = {(service, "service_healthy") for service in plan.services
                    if any(checks.get(n) for n in names.get(service, []))}
            self._meet(last - met, names, checks, t0)
        return plan

    def _meet(self, gates: set[tuple[str, str]], names: dict[str, list[str]],
              checks: dict[str, health.Check | None], t0: float) -> None:
        """Wait (in parallel) until each (service, condition) holds for all of that service's containers."""
        def meet(gate: tuple[str, str], container: str) -> None:
            service, condition = gate
            if condition == "service_healthy":
                check = checks.get(container)
                if check is None:
                    raise ComposeError(f"{service}: depends_on asks for service_healthy, but its container "
                                       f"{container} has no healthcheck")
                health.wait_healthy(self.podman, check)
                self.say(f"{service} healthy ({time.monotonic() - t0:.1f} s)")
            elif condition == "service_completed_successfully":
                code = self.podman.run("wait", container, timeout_s=3600).stdout.strip()
                if code != "0":
                    raise ComposeError(f"{service} exited {code}: depends_on asks for "
                                       "service_completed_successfully")
            # service_started: `podman start` returned, so it has.

        jobs = [(gate, c) for gate in sorted(gates) for c in names.get(gate[0], [])]
        if not jobs:
            return
        with ThreadPoolExecutor(len(jobs)) as pool:
            for future in [pool.submit(meet, gate, c) for gate, c in jobs]:
                future.result()

    # --- the rest ---------------------------------------------------------------------------------

    def down(self, volumes: bool = False, timeout_s: float | None = None) -> None:
        args = ["down"] + (["-v"] if volumes else []) + (["-t", f"{timeout_s:g}"] if timeout_s is not None else [])
        self.compose(*args)

    def passthrough(self, args: Sequence[str]) -> int:
        """A podman-compose command as is (logs, ps, ...), its output to ours."""
        try:
            self.compose(*args, capture=False, timeout_s=10**6)
        except ComposeError:
            return 1
        return 0


def _podman_compose() -> list[str]:
    if importlib.util.find_spec("podman_compose") is None:
        raise ComposeError("podman-compose is not installed here (pip install podman-compose==1.6.0; the Makefile's "
                           "venv has it)")
    return [sys.executable, "-m", "podman_compose"]


__all__ = ["ComposeError", "LABEL", "PodmanError", "Project"]
