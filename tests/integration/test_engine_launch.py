"""Starting and ending engine processes: ports bound before the model loads, PUB ports that cannot land
on a neighbouring engine's, and the exit codes a deployment's supervisor sees."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import zmq

from protocol import Ready, Stats, decode
from tests.integration.conftest import SIM
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, free_port_block, start_engine


def _listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def _no_traceback(engine: EngineProc) -> None:
    assert "Traceback" not in engine.log(), engine.log()


def test_a_taken_port_is_one_line_naming_it_and_exit_1_before_the_model_loads(tmp_path: Path) -> None:
    # A model that does not exist can only be found missing by loading it: exit 1 and the port in the
    # log show that the sockets were bound first (it used to load, then die with ZMQ's traceback).
    missing = ("--model", str(tmp_path / "no-such-model"), "--backend", "sim")
    port = free_port_block(2, spread=0)
    cases = [(port, missing, 1), (port + 40, (*missing, "--pub-port", str(port + 40)), 1),
             (port + 1, SIM, 2)]  # a unit: the rank whose port is taken ends it, the other is stopped
    for taken, args, ranks in cases:
        with _listening(taken):
            engine = start_engine(tmp_path, *args, ranks=ranks, port=port, wait=False)
            code = engine.proc.wait(60)
        lines = [line for line in engine.log().splitlines() if "cannot start" in line]
        assert code == 1, engine.log()
        assert len(lines) == 1 and f"tcp://127.0.0.1:{taken}: Address already in use" in lines[0], engine.log()
        assert "no-such-model" not in engine.log()
        _no_traceback(engine)


def test_default_pub_ports_cannot_land_on_a_neighbouring_engines_ranks(tmp_path: Path) -> None:
    # Two units of two ranks, the second at --port + 100: the PUB default used to be port + 100 + i.
    port = free_port_block(2, spread=100)
    first = start_engine(tmp_path, *SIM, "--sim-instant", ranks=2, port=port)
    try:
        second = start_engine(tmp_path, *SIM, "--sim-instant", ranks=2, port=port + 100)
        try:
            routers = {port, port + 1, port + 100, port + 101}
            pubs = first.pub_ports + second.pub_ports
            assert len(set(pubs)) == 4 and not routers & set(pubs)
            ctx = zmq.Context.instance()
            for engine in (first, second):
                for rank in range(2):
                    client = EngineClient(engine.endpoint(rank))
                    sub = ctx.socket(zmq.SUB)
                    sub.setsockopt(zmq.SUBSCRIBE, b"")
                    sub.setsockopt(zmq.LINGER, 0)
                    try:
                        ready = client.handshake(timeout_s=30)
                        assert isinstance(ready, Ready) and ready.pub_port == engine.pub_ports[rank]
                        sub.connect(f"tcp://127.0.0.1:{ready.pub_port}")  # as a frontend does on Ready
                        assert sub.poll(5000), "no Stats on the announced PUB port"
                        assert isinstance(decode(sub.recv_multipart()), Stats)
                    finally:
                        sub.close()
                        client.close()
        finally:
            assert second.stop() == 0
    finally:
        assert first.stop() == 0


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
    # --max-rank-restarts 0: the unit stops at a rank's first death instead of starting it again.
    engine = start_engine(tmp_path, *SIM, "--sim-instant", "--max-rank-restarts", "0", ranks=2)
    try:
        pids = _rank_pids(engine.proc.pid, 2)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        try:
            code = engine.proc.wait(60)
        except subprocess.TimeoutExpired:  # seen once in a loaded full run: keep what the unit said
            pytest.fail(f"the unit did not exit within 60 s of its rank's death:\n{engine.log()[-4000:]}")
        assert code == 128 + signal.SIGKILL  # it was 247: -9 passed to sys.exit
        assert "was killed by SIGKILL; stopping the other ranks (exit code 137)" in engine.log()
        _no_traceback(engine)
    finally:
        engine.stop()
