"""The engine over real tcp loopback sockets, sim backend, driven by the protocol test client."""
from __future__ import annotations

import os
import signal
import time

import msgspec
import pytest
import zmq

from protocol import (
    MAJOR,
    MINOR,
    BlockRemoved,
    BlockStored,
    EngineDead,
    Hello,
    Outputs,
    Ready,
    Reject,
    UtilityResult,
    decode,
    encode,
)
from protocol.block_hash import block_hashes
from tests.integration.conftest import SIM, SIM_ENGINE
from tests.support.engine_client import EngineClient, wait_subscribed
from tests.support.procs import pid_listening_on, start_engine

PROMPT = list(range(1000, 1064))  # 64 tokens: four full blocks of 16


def ready(client: EngineClient) -> Ready:
    msg = client.handshake(timeout_s=60)
    assert isinstance(msg, Ready), msg
    return msg


def test_handshake_accepted(client_factory, sim_engine) -> None:  # type: ignore[no-untyped-def]
    r = ready(client_factory(frontend_id="fe-accept"))
    assert (r.rank, r.backend, r.model, r.block_size, r.major) == (0, "sim", "tiny", 16, MAJOR)
    assert r.max_model_len == 4096 and r.num_kv_blocks > 0 and r.session_epoch
    assert r.pub_port == sim_engine.pub_port
    sim_engine.wait_log("accepted frontend fe-accept")


def test_other_major_refused_with_readable_reason(client_factory, sim_engine) -> None:  # type: ignore[no-untyped-def]
    c = client_factory(frontend_id="fe-old")
    ready(client_factory())  # the engine is up
    body = msgspec.msgpack.encode([MAJOR + 1, 4, "fingerprint", "fe-old", None, "a field we never knew"])
    c.send_raw([bytes((MAJOR + 1, 4, Hello.TAG)), body])
    msg = c.recv(10, any_major=True)
    assert isinstance(msg, Reject) and msg.code == "version_mismatch"
    assert f"{MAJOR + 1}.4" in msg.reason and f"{MAJOR}.{MINOR}" in msg.reason
    sim_engine.wait_log("refused handshake")
    # Not handshaken: a request on that connection is refused, not served.
    c.generate("x", PROMPT)
    assert isinstance(c.recv(10), Reject)


def test_two_frontends_get_only_their_own_outputs(client_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = client_factory(frontend_id="fe-a"), client_factory(frontend_id="fe-b")
    ready(a), ready(b)
    # Same request ids on both: the engine must keep them apart.
    for i in range(4):
        a.generate(f"r{i}", PROMPT, max_tokens=8, seed=i)
        b.generate(f"r{i}", PROMPT, max_tokens=12, seed=100 + i)
    ra, rb = a.collect([f"r{i}" for i in range(4)]), b.collect([f"r{i}" for i in range(4)])
    assert all(len(r.token_ids) == 8 and r.finish_reason == "length" for r in ra.values())
    assert all(len(r.token_ids) == 12 and r.finish_reason == "length" for r in rb.values())
    assert ra["r0"].token_ids != rb["r0"].token_ids[:8]


def test_abort_stops_a_request_within_one_step(client_factory, sim_engine) -> None:  # type: ignore[no-untyped-def]
    c = client_factory(frontend_id="fe-abort")
    ready(c)
    c.generate("long", PROMPT, max_tokens=3000)
    first = c.recv()
    assert isinstance(first, Outputs) and first.outputs[0].request_id == "long"
    c.abort("long")
    last_token_step, abort_step = first.step, None
    while abort_step is None:
        msg = c.recv()
        assert isinstance(msg, Outputs)
        for out in msg.outputs:
            if out.finish_reason == "abort":
                abort_step = msg.step
            elif out.new_token_ids:
                last_token_step = msg.step
    assert abort_step - last_token_step <= 1
    with pytest.raises(TimeoutError):  # nothing more for it
        c.recv(0.3)
    sim_engine.wait_log("rank 0 aborted request long of frontend fe-abort: the frontend aborted it")


def test_silent_client_requests_are_aborted_after_deadline(client_factory, sim_engine) -> None:  # type: ignore[no-untyped-def]
    silent, watcher = client_factory(heartbeat_s=None, frontend_id="fe-silent"), client_factory()
    ready(silent), ready(watcher)
    silent.generate("forever", PROMPT, max_tokens=3000)
    sim_engine.wait_log("frontend fe-silent silent for", timeout_s=10)
    stats = watcher.utility("stats")
    assert stats.ok and stats.result["in_flight"] == 0 and stats.result["running"] == 0
    assert "aborting its 1 request(s)" in sim_engine.log()
    assert "aborted request forever of frontend fe-silent: its frontend was silent for" in sim_engine.log()


def test_prefix_cache_and_kv_events(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sim_engine = start_engine(tmp_path, *SIM_ENGINE)  # its own: a cold prefix cache
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(sim_engine.pub_endpoint())
    c = EngineClient(sim_engine.endpoint())
    try:
        ready(c)
        wait_subscribed(sub)  # PUB/SUB: a subscription must reach the publisher before events are sent
        c.generate("p1", PROMPT, max_tokens=2)
        first = c.collect(["p1"])["p1"]
        c.generate("p2", PROMPT, max_tokens=2)
        second = c.collect(["p2"])["p2"]
        assert first.num_cached_tokens == 0
        assert second.num_cached_tokens == 48  # three full blocks; the last prompt token is recomputed
        stored: list[int] = []
        deadline = time.monotonic() + 5
        while len(stored) < 4 and time.monotonic() < deadline:
            if sub.poll(100):
                msg = decode(sub.recv_multipart())
                if isinstance(msg, BlockStored):
                    stored += msg.block_hashes
        assert stored[:4] == block_hashes(PROMPT, 16)
    finally:
        sub.close()
        c.close()
        sim_engine.stop()


def test_eviction_emits_block_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = start_engine(tmp_path, *SIM, "--sim-instant", "--sim-num-kv-blocks", "8",
                          "--max-model-len", "128")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(engine.pub_endpoint())
    c = EngineClient(engine.endpoint())
    try:
        ready(c)
        wait_subscribed(sub)
        for i in range(3):  # each 64-token prompt fills 4 of the 8 blocks
            c.generate(f"e{i}", [i * 100 + t for t in PROMPT], max_tokens=1)
            c.collect([f"e{i}"])
        removed: list[int] = []
        deadline = time.monotonic() + 5
        while not removed and time.monotonic() < deadline:
            if sub.poll(100):
                msg = decode(sub.recv_multipart())
                if isinstance(msg, BlockRemoved):
                    removed += msg.block_hashes
        assert removed and set(removed) <= set(block_hashes(PROMPT, 16) + block_hashes([100 + t for t in PROMPT], 16))
    finally:
        c.close()
        sub.close()
        engine.stop()


def test_bad_request_gets_error_naming_the_field(client_factory) -> None:  # type: ignore[no-untyped-def]
    c = client_factory()
    ready(c)
    c.generate("empty", [])
    c.generate("oov", [1, 2, 10**9])
    c.generate("temp", PROMPT, temperature=-1.0)
    res = c.collect(["empty", "oov", "temp"])
    assert all(r.finish_reason == "error" for r in res.values())
    assert "prompt_token_ids is empty" in res["empty"].error  # type: ignore[operator]
    assert "1000000000" in res["oov"].error and "[0, 151936)" in res["oov"].error  # type: ignore[operator]
    assert "sampling.temperature" in res["temp"].error  # type: ignore[operator]
    c.generate("fine", PROMPT, max_tokens=3)  # the engine carries on
    assert c.collect(["fine"])["fine"].finish_reason == "length"


def test_garbage_and_unknown_utility_do_not_hurt(client_factory, sim_engine) -> None:  # type: ignore[no-untyped-def]
    c = client_factory()
    ready(c)
    c.send_raw([b"\xff\xff", b"garbage"])
    c.send_raw([encode(Hello(MAJOR, MINOR, "x", "y"))[0][:2] + b"\x05", b"\xc1"])
    bad = c.utility("__class__")
    assert isinstance(bad, UtilityResult) and not bad.ok and "unknown utility" in bad.error  # type: ignore[operator]
    wrong = c.utility("sleep", level="deep")
    assert not wrong.ok and "'level' must be one of 1, 2, got 'deep' (str)" in wrong.error  # type: ignore[operator]
    c.generate("after", PROMPT, max_tokens=2)
    assert c.collect(["after"])["after"].finish_reason == "length"
    assert "undecodable message" in sim_engine.log()


def test_heartbeats_arrive_when_idle(client_factory) -> None:  # type: ignore[no-untyped-def]
    c = client_factory()
    ready(c)
    with pytest.raises(TimeoutError):
        c.recv(0.5)
    seqs = [s.seq for s in c.stats]
    assert len(seqs) >= 3 and seqs == sorted(seqs)


def test_sigterm_drains_in_flight_then_exits_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "5")
    c, late = EngineClient(engine.endpoint()), EngineClient(engine.endpoint())
    try:
        ready(c)
        ready(late)
        c.generate("inflight", PROMPT, max_tokens=100)
        first = c.recv()
        assert isinstance(first, Outputs)
        engine.proc.terminate()
        engine.wait_log("draining")
        late.generate("late", PROMPT, max_tokens=5)
        assert "draining" in (late.collect(["late"])["late"].error or "")
        done = c.collect(["inflight"])["inflight"]
        assert done.finish_reason == "length"
        assert len(first.outputs[0].new_token_ids) + len(done.token_ids) == 100
        assert isinstance(c.recv(10), EngineDead)
        assert engine.proc.wait(30) == 0
    finally:
        c.close()
        late.close()
        engine.stop()


def test_a_supervised_unit_restarts_a_killed_rank_and_stops_when_it_keeps_dying(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = start_engine(tmp_path, *SIM, "--sim-instant", "--max-rank-restarts", "1", ranks=2)
    survivor = EngineClient(engine.endpoint(0))
    try:
        first_epoch = ready(survivor).session_epoch
        victim = pid_listening_on(engine.port + 1)
        os.kill(victim, signal.SIGKILL)
        engine.wait_log("engine-rank-1 was killed by SIGKILL; starting it again")
        deadline = time.monotonic() + 60
        while True:  # the same ports, a new process
            try:
                if pid_listening_on(engine.port + 1) != victim:
                    break
            except LookupError:
                pass
            assert time.monotonic() < deadline, engine.log()
            time.sleep(0.05)
        back = EngineClient(engine.endpoint(1))
        try:
            assert ready(back).rank == 1
        finally:
            back.close()
        survivor.generate("r", PROMPT, max_tokens=4)  # rank 0 served throughout, in the same session
        assert survivor.collect(["r"])["r"].finish_reason == "length"
        assert survivor.handshake().session_epoch == first_epoch
        os.kill(pid_listening_on(engine.port + 1), signal.SIGKILL)  # a second death within the window
        assert engine.proc.wait(30) == 128 + signal.SIGKILL
        assert "stopping the other ranks (exit code 137): 1 restart(s) within 600s already" in engine.log()
    finally:
        survivor.close()
        engine.stop()


def test_two_ranks_from_one_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = start_engine(tmp_path, *SIM, "--sim-instant", ranks=2)
    clients = [EngineClient(engine.endpoint(i)) for i in range(2)]
    try:
        assert [ready(c).rank for c in clients] == [0, 1]
        for c in clients:
            c.generate("r", PROMPT, max_tokens=4)
            assert c.collect(["r"])["r"].finish_reason == "length"
    finally:
        for c in clients:
            c.close()
        assert engine.stop() == 0
