"""Containers' healthchecks run on demand (`podman healthcheck run`), as podman's systemd timer would run
them on a host with systemd: one check, and a wait for healthy paced at the check's interval within its
start period and retries. Used by `python -m deploy.compose up` and its keeper."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from deploy.podman import Podman

_NS = 1e9  # podman reports durations in nanoseconds
# Docker's defaults for a healthcheck that leaves a field out (podman takes the same).
_DEFAULTS = {"Interval": 30e9, "Timeout": 30e9, "StartPeriod": 0, "Retries": 3}


class Unhealthy(RuntimeError):
    """A container did not turn healthy in time, or stopped; the message says which and shows why."""


@dataclass(frozen=True, slots=True)
class Check:
    """A container's healthcheck as podman holds it (the compose file's, else the image's)."""
    container: str
    interval_s: float
    timeout_s: float
    start_period_s: float
    retries: int

    @property
    def budget_s(self) -> float:
        """How long a start may take: the start period, then `retries` failed checks in a row."""
        return self.start_period_s + self.retries * (self.interval_s + self.timeout_s)


def check_of(container: str, inspected: dict[str, Any]) -> Check | None:
    """The healthcheck of one `podman inspect` record, or None when the container has none."""
    hc = (inspected.get("Config") or {}).get("Healthcheck") or {}
    test = hc.get("Test") or []
    if not test or test[0] == "NONE":
        return None
    get = {k: hc.get(k) or v for k, v in _DEFAULTS.items()}
    return Check(container, get["Interval"] / _NS, get["Timeout"] / _NS, get["StartPeriod"] / _NS, int(get["Retries"]))


def checks(podman: Podman, containers: list[str]) -> dict[str, Check | None]:
    """Each container's healthcheck (None: it has none), from one `podman inspect`."""
    if not containers:
        return {}
    return {str(r["Name"]): check_of(str(r["Name"]), r) for r in inspect(podman, *containers)}


def inspect(podman: Podman, *containers: str) -> list[dict[str, Any]]:
    records = json.loads(podman.run("container", "inspect", *containers).stdout)
    assert isinstance(records, list)
    return records


def run_once(podman: Podman, check: Check) -> int:
    """One check now (podman records it in the container's health log and status): 0 healthy, 1 not,
    125 no check could run (the container is not running, or is gone)."""
    done = podman.run("healthcheck", "run", check.container, timeout_s=check.timeout_s + 30, check=False)
    return done.returncode


def wait_healthy(podman: Podman, check: Check) -> float:
    """Run `check` every interval until it passes (returns the seconds it took); Unhealthy when its budget is
    spent or the container stops for good, with its last check's output and its last log lines."""
    t0 = time.monotonic()
    while True:
        started = time.monotonic()
        if run_once(podman, check) == 0:
            return time.monotonic() - t0
        record = inspect(podman, check.container)[0]
        state = record.get("State") or {}
        if state.get("Status") == "exited" and _restart_policy(record) in ("", "no"):
            raise Unhealthy(f"{check.container} stopped ({state.get('Status')}, exit code {state.get('ExitCode')}) "
                            f"before it was healthy{_evidence(podman, check.container)}")
        if time.monotonic() - t0 > check.budget_s:
            raise Unhealthy(f"{check.container} not healthy within {check.budget_s:g} s (start period "
                            f"{check.start_period_s:g} s, then {check.retries} checks every {check.interval_s:g} s)"
                            f"{_evidence(podman, check.container)}")
        # The pace of the checks, as podman's timer keeps it: not a wait for something to happen.
        time.sleep(max(0.0, check.interval_s - (time.monotonic() - started)))


def status(record: dict[str, Any]) -> str:
    """The health status in an inspect record ('healthy', 'unhealthy', 'starting'), '' without a check."""
    state = record.get("State") or {}
    health = state.get("Healthcheck") or state.get("Health") or {}
    return str(health.get("Status") or "")


def _restart_policy(record: dict[str, Any]) -> str:
    return str(((record.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "")


def _evidence(podman: Podman, container: str) -> str:
    """Its last check's output and its last log lines: why, for the person reading the failure."""
    state = inspect(podman, container)[0].get("State") or {}
    log = (state.get("Healthcheck") or state.get("Health") or {}).get("Log") or []
    last = (log[-1].get("Output") or "").strip() if log else "(no check ran)"
    lines = podman.run("logs", "--tail", "40", container, check=False)
    return f"\nits last check said: {last}\nits last log lines:\n{lines.stdout}{lines.stderr}"
