"""Starting and ending engine processes: the exit codes a deployment's supervisor sees."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.integration.conftest import SIM
from tests.support.procs import EngineProc, start_engine


def _no_traceback(engine: EngineProc) -> None:
    assert "Traceback" not in engine.log(), engine.log()


def _rank_pids(supervisor: int, ranks: int) -> list[int]:
    """The spawned rank processes among the supervisor's children (not multiprocessing's resource tracker)."""
    deadline = time.monotonic() + 10
    while True:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
        pids = [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        if len(pids) == ranks or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def test_a_supervised_unit_whose_rank_is_killed_exits_128_plus_the_signal(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-instant", ranks=2)
    try:
        pids = _rank_pids(engine.proc.pid, 2)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        assert engine.proc.wait(60) == 128 + signal.SIGKILL  # it was 247: -9 passed to sys.exit
        assert "was killed by SIGKILL; stopping the other ranks (exit code 137)" in engine.log()
        _no_traceback(engine)
    finally:
        engine.stop()
