"""deploy/compose/run.py with throwaway services: a service that dies ends the run and takes the
others (and their children) down; a dependency that never turns healthy keeps its dependants unstarted."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.procs import group_gone

RUN = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "run.py"
# A parent with a child, as a service with worker processes: teardown must reach both.
SLEEPER = ["python", "-c",
           "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(120)'])"]


def _run(tmp_path: Path, services: dict[str, object]) -> tuple[int, str]:
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump({"services": services}))
    done = subprocess.run([sys.executable, str(RUN), str(path), "--volumes-dir", str(tmp_path / "v"), "--grace", "5"],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


def test_a_service_that_exits_stops_the_rest(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, {
        "sleeper": {"command": SLEEPER},
        "crasher": {"command": ["python", "-c", "print('bye'); raise SystemExit(3)"],
                    "depends_on": ["sleeper"]},
    })
    assert rc == 1
    assert "crasher | bye" in out and ("crasher exited with 3" in out)
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", out)]
    assert len(pids) == 2 and all(group_gone(p) for p in pids)  # the sleeper's child too: its whole group


def test_an_unhealthy_dependency_is_not_waited_on_forever(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, {
        "db": {"command": SLEEPER, "healthcheck": {"test": ["CMD", "python", "-c", "raise SystemExit(1)"],
                                                   "interval": "100ms", "retries": 2}},
        "app": {"command": SLEEPER, "depends_on": {"db": {"condition": "service_healthy"}}},
    })
    assert rc == 1
    assert "db not healthy within" in out and "started app" not in out
    assert all(group_gone(int(p)) for p in re.findall(r"started \S+ \(pid (\d+)\)", out))
