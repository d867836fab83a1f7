"""The rank supervisor's bookkeeping, its processes faked at the multiprocessing port (the real unit is
killed and restarted in tests/integration/test_frontend_faults.py and test_engine_launch.py)."""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.engine import launcher
from services.engine.config import EngineConfig


class _Rank:
    """A rank process: ready once started; killed at its first join if `killed`, else it runs until it is
    terminated."""

    def __init__(self, ctx: _Context, name: str, ready: threading.Event) -> None:
        self.ctx, self.name, self.ready = ctx, name, ready
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.terminated = False
        self.killed = False

    def start(self) -> None:
        self.pid = 100 + len(self.ctx.started)
        self.ctx.started.append(self)
        self.ready.set()
        self.ctx.on_start(self)

    def terminate(self) -> None:
        self.terminated = True
        self.exitcode = -signal.SIGTERM  # before its own handler is installed: SIGTERM's default

    def is_alive(self) -> bool:
        return self.pid is not None and self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        self.ctx.joins += 1
        if self.killed:
            self.exitcode = -signal.SIGKILL
        if self.ctx.joins > 200:  # the supervisor would wait for this rank forever
            raise AssertionError(f"{self.name} is never told to stop")


class _Context:
    def __init__(self, on_start: Callable[[_Rank], None]) -> None:
        self.on_start = on_start
        self.started: list[_Rank] = []
        self.joins = 0

    def Event(self) -> threading.Event:
        return threading.Event()

    def Process(self, target: Any, args: tuple[Any, ...], name: str) -> _Rank:
        return _Rank(self, name, args[1])


@pytest.fixture
def handlers() -> Iterator[None]:
    """supervise() installs SIGTERM and SIGINT handlers: this process's own are given back after."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def test_a_stop_signal_while_a_killed_rank_is_started_again_stops_the_new_rank(
        monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    """SIGTERM reaching the supervisor while it starts a rank again (the handler runs before the new process
    is in its table) still stops that rank: the unit exits rather than waiting on it for good."""

    def on_start(rank: _Rank) -> None:
        if len(ctx.started) == 1:
            rank.killed = True  # after it served: it is started again
        else:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside start()

    ctx = _Context(on_start)
    monkeypatch.setattr(launcher.multiprocessing, "get_context", lambda method: ctx)
    code = launcher.supervise(EngineConfig(model="tiny", backend="sim", data_parallel_size_local=1))
    first, again = ctx.started
    assert again.terminated and not first.terminated
    assert code == 128 + signal.SIGTERM  # the unit's code is its ranks', as a shell reports it
