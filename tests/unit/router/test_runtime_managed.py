"""Supervision of managed workers (runtime/managed.py) with real child processes (small Python ones, not
the engine and frontend: tests/integration/test_router_runtime.py runs those): a process that exits is
started again with back-off; stop leaves nothing of its process group; a router killed outright (no
code runs) still takes its workers with it (orphan_guard)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.router.runtime import managed
from services.router.runtime.managed import Supervised
from tests.support.procs import group_gone

SLEEPER = "import time; time.sleep(600)"


async def _until(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_process_that_exits_is_started_again_with_growing_back_off(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(managed, "BACKOFF_FIRST_S", 0.01)
    monkeypatch.setattr(managed, "BACKOFF_MAX_S", 0.04)

    async def go() -> list[int]:
        worker = Supervised("worker w", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
        worker.start()
        pids: list[int] = []

        def seen() -> bool:
            if worker.proc is not None and worker.proc.pid not in pids:
                pids.append(worker.proc.pid)
            return worker.restarts >= 4

        await _until(seen)
        await worker.stop()
        return pids

    with caplog.at_level(logging.WARNING, logger="router.runtime"):
        pids = asyncio.run(go())
    assert len(set(pids)) >= 2  # new processes, not one waited on again
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(") ", 1)[1] for line in lines[:4]] == [
        "exited with code 3; restart 1 in 0.01s", "exited with code 3; restart 2 in 0.02s",
        "exited with code 3; restart 3 in 0.04s", "exited with code 3; restart 4 in 0.04s"]  # capped


def test_stop_ends_the_process_and_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = (f"import subprocess, sys, pathlib, time; p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
            f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid)); time.sleep(600)")

    async def go() -> int:
        worker = Supervised("worker w", [sys.executable, "-c", code], dict(os.environ))
        worker.start()
        await worker.started()
        await _until(lambda: pid_file.exists() and pid_file.read_text())
        assert worker.proc is not None
        pgid = worker.proc.pid  # a session of its own: its pid is its group's id
        await worker.stop()
        assert worker.proc.returncode is not None and worker.restarts == 0
        return pgid

    pgid = asyncio.run(go())
    assert group_gone(pgid), "a process of the stopped worker's group is still running"


def test_a_router_killed_outright_takes_its_workers_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker"
    router = textwrap.dedent(f"""
        import asyncio, os, pathlib, sys
        from services.router.runtime.managed import Supervised

        async def main():
            worker = Supervised("w", [sys.executable, "-c", {SLEEPER!r}], dict(os.environ))
            worker.start()
            await worker.started()
            pathlib.Path({str(pid_file)!r}).write_text(str(worker.proc.pid))
            await asyncio.Event().wait()

        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", router])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the router never started its worker"
            time.sleep(0.01)
        worker = int(pid_file.read_text())
        # Until the guard has become the worker (exec): killed before that, the guard's own check stops it.
        while b"orphan_guard" in Path(f"/proc/{worker}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert group_gone(worker), "the worker outlived the router that was killed"


class _SamePort:
    """A socket whose OS pick is scripted: the OS may hand the port a closed probe held to the next call."""

    picks = [5000, 5000, 5001]

    def __enter__(self) -> _SamePort:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self.picks.pop(0)


def test_two_workers_never_get_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(managed.socket, "socket", _SamePort)
    monkeypatch.setattr(managed, "_handed_out", set(), raising=False)
    assert [managed.free_port(), managed.free_port()] == [5000, 5001]
