"""services/engine/probe.py against a fake engine ROUTER socket: ready only on Ready, not on a bound
port that does not answer (an engine still loading its model), nor on a Reject (a draining rank)."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import zmq

from protocol import MAJOR, MINOR, Heartbeat, Hello, Ready, Reject, decode, encode
from services.engine import probe

Answer = list[object]  # what the fake engine sends back to a Hello, in order


@pytest.fixture
def engine() -> Iterator[tuple[int, Answer, list[Hello]]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    answer: Answer = []
    hellos: list[Hello] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not sock.poll(20):
                continue
            identity, *frames = sock.recv_multipart()
            msg = decode(frames)
            assert isinstance(msg, Hello)
            hellos.append(msg)
            for reply in answer:
                sock.send_multipart([identity, *encode(reply)])  # type: ignore[arg-type]

    thread = threading.Thread(target=serve)
    thread.start()
    yield port, answer, hellos
    stop.set()
    thread.join()
    sock.close()
    ctx.term()


def test_ready_after_heartbeats(engine: tuple[int, Answer, list[Hello]]) -> None:
    port, answer, hellos = engine
    answer += [Heartbeat(1, 0.0), Ready(3, "tiny", 4096, 16, 100, "sim", "test", "epoch", 5556, MAJOR, MINOR)]
    assert probe.probe("127.0.0.1", port, 5.0, "secret") == (True, "rank 3 ready: model=tiny backend=sim")
    assert hellos[0].auth_token == "secret" and hellos[0].frontend_id.startswith("probe-")


def test_a_bound_port_that_does_not_answer_is_not_ready(engine: tuple[int, Answer, list[Hello]]) -> None:
    port, _, hellos = engine
    ok, said = probe.probe("127.0.0.1", port, 0.3)
    assert not ok and "no answer" in said
    assert len(hellos) == 1  # the Hello reached the socket: the port was open


def test_a_refused_handshake_is_not_ready(engine: tuple[int, Answer, list[Hello]]) -> None:
    port, answer, _ = engine
    answer.append(Reject("draining", "the engine is draining"))
    assert probe.probe("127.0.0.1", port, 5.0) == (False, "refused: draining: the engine is draining")


def test_main_exits_1_when_nothing_listens() -> None:
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--port", "1", "--timeout", "0.2"])
    assert exit_.value.code == 1
