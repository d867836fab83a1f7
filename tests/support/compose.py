"""Run deploy/compose files with deploy/compose/run.py for tests: wait for "all services up", learn
each service's pid and the router's local URL, keep the runner's output for failures."""
from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"


@dataclass
class ComposeRun:
    runner: subprocess.Popen[str]
    router_url: str
    pids: dict[str, int]  # service -> pid (its own process group)
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def output(self, last: int = 60) -> str:
        return "".join(self.lines[-last:])

    def close(self) -> None:
        """Kill whatever is left (after a failed test) and release the pipe."""
        if self.runner.poll() is None:
            os.killpg(self.runner.pid, signal.SIGTERM)
            try:
                self.runner.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.runner.pid, signal.SIGKILL)
                self.runner.wait()
        if self.reader is not None:
            self.reader.join(10)
        assert self.runner.stdout is not None
        self.runner.stdout.close()


def start_compose(tmp: Path, *files: str, timeout_s: float = 60.0, grace_s: float = 10.0) -> ComposeRun:
    ports_file = tmp / "ports.json"
    runner = subprocess.Popen(
        [sys.executable, str(COMPOSE / "run.py"), *(str(COMPOSE / f) for f in files), "--ports-file", str(ports_file),
         "--volumes-dir", str(tmp / "volumes"), "--grace", str(grace_s)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "ENGINE_AUTH_TOKEN": secrets.token_hex(16)})  # the compose file asks for one
    run = ComposeRun(runner, "", {})
    events: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert runner.stdout is not None
        for line in runner.stdout:
            run.lines.append(line)
            events.put(line)
        events.put("")

    run.reader = threading.Thread(target=pump, daemon=True)
    run.reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            line = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith("run | all services up"):
                break
            if not line or time.monotonic() > deadline:
                raise RuntimeError("the fleet did not come up:\n" + run.output())
    except (queue.Empty, RuntimeError):
        run.close()
        raise
    run.pids = {m[1]: int(m[2]) for m in (re.match(r"run \| started (\S+) \(pid (\d+)\)", x) for x in run.lines) if m}
    run.router_url = f"http://127.0.0.1:{json.loads(ports_file.read_text())['router']['8080']}"
    return run
