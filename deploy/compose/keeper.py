"""Keeps a compose project's healthchecks running while it is up, each at its interval: what podman's
systemd timers do on a host with systemd, so that `podman ps` shows health and a restarted container turns
healthy again. Its own process, started detached by `python -m deploy.compose up -d`; `down` stops it, and
it exits by itself once the project has no container left.

    python -m deploy.compose.keeper --project NAME [--root PODMAN_ROOT]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from deploy.compose import health
from deploy.podman import Podman

LABEL = "io.podman.compose.project"
_REFRESH_S = 5.0  # how often the project's containers are listed again (one may be recreated)


def pidfile(podman: Podman, project: str) -> Path:
    return podman.root / "compose" / f"{project}.keeper.pid"


def logfile(podman: Podman, project: str) -> Path:
    return podman.root / "compose" / f"{project}.keeper.log"


def start(podman: Podman, project: str) -> int:
    """A keeper for `project`, detached from this process (a previous one is stopped first); its pid."""
    stop(podman, project)
    path = pidfile(podman, project)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    with logfile(podman, project).open("ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "deploy.compose.keeper", "--project", project,
                                  "--root", str(podman.root)], cwd=root, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": str(root)})
    path.write_text(str(child.pid))
    return child.pid


def stop(podman: Podman, project: str, timeout_s: float = 60) -> None:
    """Stop the project's keeper, if one runs, and wait until it has exited (a check it is running ends);
    its pidfile and log go with it."""
    path = pidfile(podman, project)
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        logfile(podman, project).unlink(missing_ok=True)
        return
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a process we do not parent: there is nothing to wait on
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    path.unlink(missing_ok=True)
    logfile(podman, project).unlink(missing_ok=True)


def keep(podman: Podman, project: str, stopping: threading.Event) -> None:
    """Run each container's check when due until `stopping` is set, the project has no container left, or
    another keeper has taken over the pidfile."""
    checks: dict[str, health.Check] = {}
    due: dict[str, float] = {}
    listed = float("-inf")
    me = str(os.getpid())
    while not stopping.is_set():
        now = time.monotonic()
        if now - listed >= _REFRESH_S:
            owner = _owner(podman, project)
            if owner and owner != me:  # empty: `up` has not written it yet
                return
            names = _containers(podman, project)
            if not names:
                return
            checks = {n: c for n, c in health.checks(podman, names).items() if c is not None}
            due = {n: due.get(n, now) for n in checks}
            listed = now
        for name in [n for n, t in due.items() if t <= now]:
            health.run_once(podman, checks[name])
            due[name] = time.monotonic() + checks[name].interval_s
        wake = min([*due.values(), listed + _REFRESH_S])
        stopping.wait(max(0.0, wake - time.monotonic()))


def _containers(podman: Podman, project: str) -> list[str]:
    rows = json.loads(podman.run("ps", "-a", "--filter", f"label={LABEL}={project}", "--format", "json",
                                 check=False).stdout or "[]")
    return sorted(n for row in rows for n in row.get("Names") or [])


def _owner(podman: Podman, project: str) -> str:
    try:
        return pidfile(podman, project).read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, not yet reaped) is gone for every purpose here.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", required=True)
    p.add_argument("--root", type=Path, help="podman's storage root (default: deploy/podman.py's)")
    args = p.parse_args()
    podman = Podman(args.root) if args.root else Podman.default()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    keep(podman, args.project, stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
