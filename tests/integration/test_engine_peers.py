"""The engine's peers over real sockets (sim backend): a SIGKILLed frontend's requests are aborted when
its connection closes, not at --client-timeout; retried Hellos of one session get one Ready; and with a
handshake token, a peer that did not present it pauses, aborts, loads and pushes nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import Abort, GenerateRequest, Ready, Reject, SamplingParams, UtilityCall, make_hello
from tests.integration.conftest import SIM
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine

ROOT = Path(__file__).resolve().parents[2]
PROMPT = list(range(1000, 1064))
TOKEN = "shared-handshake-token"
# A frontend stand-in in its own process: handshakes, starts a long request, says so, then waits to be killed.
DOOMED_PEER = """
import sys, threading
from protocol import Outputs, Ready, make_hello
from tests.support.engine_client import EngineClient
c = EngineClient(sys.argv[1], frontend_id="fe-doomed", heartbeat_s=0.1)
assert isinstance(c.handshake(make_hello("fe-doomed", sys.argv[2]), timeout_s=30), Ready)
c.generate("doomed", list(range(1000, 1064)), max_tokens=3000)
assert isinstance(c.recv(30), Outputs)
print("running", flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """A client deadline far beyond every wait here: only the connection closing can explain an abort."""
    e = start_engine(tmp_path_factory.mktemp("peers"), *SIM, "--sim-decode-ms", "2", "--client-timeout", "60",
                     env={"ENGINE_AUTH_TOKEN": TOKEN})
    yield e
    e.stop()


@pytest.fixture
def connect(engine: EngineProc) -> Iterator:  # type: ignore[type-arg]
    clients: list[EngineClient] = []

    def make(frontend_id: str, token: str | None = TOKEN) -> EngineClient:
        c = EngineClient(engine.endpoint(), frontend_id)
        clients.append(c)
        if token != "no hello":
            msg = c.handshake(make_hello(frontend_id, token), timeout_s=30)
            assert isinstance(msg, Ready if token == TOKEN else Reject), msg
        return c

    yield make
    for c in clients:
        c.close()


def _in_flight(watcher: EngineClient) -> int:
    stats = watcher.utility("stats")
    assert stats.ok
    return int(stats.result["in_flight"])


def test_a_sigkilled_frontends_requests_are_aborted_when_its_connection_closes(engine: EngineProc, connect) -> None:  # type: ignore[no-untyped-def]
    watcher = connect("fe-watcher")
    peer = subprocess.Popen([sys.executable, "-c", DOOMED_PEER, engine.endpoint(), TOKEN], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None and peer.stdout.readline() == "running\n"
        assert _in_flight(watcher) == 1
        peer.send_signal(signal.SIGKILL)
        peer.wait(10)
        deadline = time.monotonic() + 10  # well inside --client-timeout 60
        while _in_flight(watcher) and time.monotonic() < deadline:
            watcher.utility("stats")  # a round trip, not a sleep: the engine has handled what came before
        assert _in_flight(watcher) == 0
        engine.wait_log("frontend fe-doomed closed its connection; aborting its 1 request(s)")
        assert "aborted request doomed of frontend fe-doomed: its frontend's connection closed" in engine.log()
        assert "fe-doomed silent for" not in engine.log()
    finally:
        peer.kill()
        peer.wait()
        assert peer.stdout is not None
        peer.stdout.close()


def test_a_burst_of_hellos_from_one_session_gets_one_ready_and_one_log_line(engine: EngineProc, connect) -> None:  # type: ignore[no-untyped-def]
    c = connect("fe-burst", token="no hello")
    for _ in range(52):  # the retries that queue while a rank loads
        c.send(make_hello("fe-burst", TOKEN))
    stats = c.utility("stats", timeout_s=30)  # answered after every Hello before it was handled
    assert stats.ok
    assert sum(isinstance(m, Ready) for m in c.others) == 1
    assert engine.log().count("accepted frontend fe-burst ") == 1


def test_a_peer_without_the_token_pauses_aborts_loads_and_pushes_nothing(engine: EngineProc, connect,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    legit = connect("fe-legit")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    version = legit.utility("weight_version").result
    legit.send(GenerateRequest("victim", PROMPT, SamplingParams(max_tokens=400), time.time()))
    attacks = [UtilityCall(1, "pause", {"mode": "abort"}), Abort(["victim"]),
               UtilityCall(2, "add_lora", {"name": "evil", "path": str(adapter)}),
               UtilityCall(3, "start_weight_update", {}), UtilityCall(4, "update_weights", {"tensors": []}),
               UtilityCall(5, "finish_weight_update", {"version": "evil"}),
               GenerateRequest("free-ride", PROMPT, SamplingParams(max_tokens=4), time.time())]
    no_hello = connect("fe-no-hello", token="no hello")
    wrong = connect("fe-wrong-token", token="wrong")  # its Hello refused: unauthorized
    for attacker in (no_hello, wrong):
        for msg in attacks:
            attacker.send(msg)
    for attacker in (no_hello, wrong):
        refusals = [attacker.recv(30) for _ in attacks]
        assert all(isinstance(r, Reject) and "no session on this connection" in r.reason for r in refusals), refusals
    # The victim ran to its end; nothing is paused, loaded or pushed.
    assert legit.collect(["victim"])["victim"].finish_reason == "length"
    assert legit.utility("is_paused").result["paused"] is False
    assert legit.utility("list_loras").result == []
    assert legit.utility("weight_version").result == version
    log = engine.log()
    assert log.count("refused messages from b'fe-no-hello'") == 1  # seven refused, one line
    assert log.count("refused messages from b'fe-wrong-token'") == 1
    assert "refused handshake from fe-wrong-token (protocol" in log and "auth token missing or wrong" in log
