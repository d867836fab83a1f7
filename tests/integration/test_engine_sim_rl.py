"""The RL-control utilities on a real sim engine process over tcp loopback: pause in each mode with
requests in flight, requests held while paused, sleep and wake, weight-update sessions, LoRA by name."""
from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import GenerateRequest, Outputs, Ready, SamplingParams, UtilityResult
from tests.integration.conftest import SIM
from tests.support.adapters import fake_adapter
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine

PROMPT = list(range(1000, 1040))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """One rank for the module, 5 ms decode steps: a 100-token request runs about half a second."""
    proc = start_engine(tmp_path_factory.mktemp("sim-rl"), *SIM, "--sim-decode-ms", "5")
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture
def connect(engine: EngineProc) -> Iterator:  # type: ignore[type-arg]
    clients: list[EngineClient] = []

    def make() -> EngineClient:
        c = EngineClient(engine.endpoint())
        assert isinstance(c.handshake(timeout_s=60), Ready)
        clients.append(c)
        return c

    yield make
    # Every test leaves the engine running and awake for the next one.
    assert clients[0].utility("resume").ok and clients[0].utility("wake_up").ok
    for c in clients:
        c.close()


def first_output(c: EngineClient) -> Outputs:
    msg = c.recv(10)
    assert isinstance(msg, Outputs), msg
    return msg


def assert_silent(c: EngineClient, window_s: float = 0.3) -> list[Outputs]:
    """Nothing but heartbeats for a while (what a frozen engine sends), after at most the outputs of the
    one step that was running when the pause arrived (the sim delivers a step when its time is up)."""
    late: list[Outputs] = []
    while True:
        try:
            msg = c.recv(window_s)
        except TimeoutError:
            return late
        assert isinstance(msg, Outputs) and not late, f"the engine was not frozen: {msg}"
        late.append(msg)


def finishes(c: EngineClient, rids: list[str]) -> dict[str, str | None]:
    """Each request's finish reason, also from outputs that arrived while a utility call waited."""
    got = {o.request_id: o.finish_reason for m in c.others if isinstance(m, Outputs) for o in m.outputs
           if o.finish_reason is not None}
    c.others.clear()
    rest = [rid for rid in rids if rid not in got]
    got.update({rid: r.finish_reason for rid, r in c.collect(rest).items()})
    return got


def tokens_in(msgs: list[Outputs], rid: str) -> int:
    return sum(len(o.new_token_ids) for m in msgs for o in m.outputs if o.request_id == rid)


def test_keep_freezes_in_flight_requests_and_holds_new_ones_until_resume(connect) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    c.generate("a", PROMPT, max_tokens=100, seed=1)
    c.generate("b", PROMPT, max_tokens=100, seed=2)
    seen = [first_output(c)]
    r = c.utility("pause")  # mode "keep" by default
    assert r.ok and r.result == {"paused": True, "mode": "keep", "aborted": 0}
    seen += [m for m in c.others if isinstance(m, Outputs)]
    c.others.clear()
    # The step running when the pause arrived may deliver in any of the windows below (late on a loaded
    # host); it counts, and no second one may come.
    late = assert_silent(c)
    c.generate("late", PROMPT, max_tokens=5, seed=3)
    assert c.utility("is_paused").result == {"paused": True, "mode": "keep", "held": 1}
    late += [m for m in c.others if isinstance(m, Outputs)]
    c.others.clear()
    late += assert_silent(c)
    assert len(late) <= 1, f"the engine was not frozen: {late}"
    seen += late
    # The held request counts as waiting (b may itself still wait at the backend: it was sent second).
    assert c.stats[-1].running + c.stats[-1].waiting == 3 and c.stats[-1].waiting >= 1
    assert c.utility("resume").result is True
    assert c.utility("is_paused").result == {"paused": False, "mode": None, "held": 0}
    done = c.collect(["a", "b", "late"])
    for rid, n in (("a", 100), ("b", 100), ("late", 5)):
        assert done[rid].finish_reason == "length"
        assert tokens_in(seen, rid) + len(done[rid].token_ids) == n  # continued where it was frozen


def test_abort_ends_every_peers_requests_then_pauses(connect) -> None:  # type: ignore[no-untyped-def]
    a, b = connect(), connect()
    a.generate("x", PROMPT, max_tokens=2000)
    a.generate("y", PROMPT, max_tokens=2000)
    b.generate("x", PROMPT, max_tokens=2000)
    first_output(b)
    r = a.utility("pause", mode="abort")
    assert r.ok and r.result == {"paused": True, "mode": "abort", "aborted": 3}
    assert finishes(a, ["x", "y"]) == {"x": "abort", "y": "abort"}
    assert finishes(b, ["x"]) == {"x": "abort"}
    # Paused: a new request is held; aborting it answers it as any abort does.
    a.generate("held", PROMPT, max_tokens=5)
    assert a.utility("is_paused").result == {"paused": True, "mode": "abort", "held": 1}
    a.abort("held")
    assert finishes(a, ["held"]) == {"held": "abort"}
    assert a.utility("is_paused").result["held"] == 0
    assert a.utility("resume").ok
    a.generate("after", PROMPT, max_tokens=5)
    assert a.collect(["after"])["after"].finish_reason == "length"


def test_wait_answers_only_once_in_flight_requests_finished(connect) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    c.generate("a", PROMPT, max_tokens=60)
    c.generate("b", PROMPT, max_tokens=30)
    first_output(c)
    call = c.send_utility("pause", mode="wait")
    c.generate("late", PROMPT, max_tokens=5)  # while pausing: held, not admitted
    order: list[str] = []
    result = None
    while result is None:
        msg = c.recv(10)
        if isinstance(msg, UtilityResult) and msg.call_id == call:
            result = msg
        elif isinstance(msg, Outputs):
            order += [f"{o.request_id}:{o.finish_reason}" for o in msg.outputs if o.finish_reason is not None]
    assert result.ok and result.result == {"paused": True, "mode": "wait", "aborted": 0}
    assert sorted(order) == ["a:length", "b:length"]  # both finished before the pause was answered
    assert c.utility("is_paused").result == {"paused": True, "mode": "wait", "held": 1}
    assert_silent(c)
    assert c.utility("resume").ok
    assert c.collect(["late"])["late"].finish_reason == "length"


def test_wait_with_nothing_in_flight_answers_at_once_and_resume_cancels_a_pending_wait(connect) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    assert c.utility("pause", mode="wait").result == {"paused": True, "mode": "wait", "aborted": 0}
    assert c.utility("resume").ok
    c.generate("long", PROMPT, max_tokens=3000)
    first_output(c)
    call = c.send_utility("pause", mode="wait")
    assert c.utility("is_paused").result == {"paused": False, "mode": "wait", "held": 0}  # still draining
    assert c.utility("resume").ok
    # The pending pause is answered first, then the resume.
    [r] = [m for m in c.others if isinstance(m, UtilityResult) and m.call_id == call]
    assert not r.ok and "cancelled by resume" in (r.error or "")
    c.abort("long")


def test_a_bad_pause_mode_names_the_allowed_ones(connect) -> None:  # type: ignore[no-untyped-def]
    r = connect().utility("pause", mode="later")
    assert not r.ok and "argument 'mode' must be one of 'keep', 'abort', 'wait', got 'later'" in (r.error or "")


def test_sleep_holds_new_work_until_woken(connect) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    assert c.utility("is_sleeping").result is False
    r = c.utility("sleep", level=3)
    assert not r.ok and "argument 'level' must be one of 1, 2" in (r.error or "")
    assert c.utility("sleep", level=1).ok
    assert c.utility("is_sleeping").result is True
    c.generate("s", PROMPT, max_tokens=5)
    assert_silent(c)
    assert c.utility("wake_up").ok
    assert c.utility("is_sleeping").result is False
    assert c.collect(["s"])["s"].finish_reason == "length"


def test_weight_update_session_checks_and_counts_bytes(connect) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    version = c.utility("weight_version").result
    r = c.utility("update_weights", tensors=[])
    assert not r.ok and "no weight update is open; call start_weight_update first" in (r.error or "")
    r = c.utility("finish_weight_update", version="v1")
    assert not r.ok and "no weight update is open" in (r.error or "")
    assert c.utility("start_weight_update").result is True
    assert "already open" in (c.utility("start_weight_update").error or "")
    assert c.utility("stats").result["weight_update_open"] is True
    w = struct.pack("<6f", *range(6))
    tensors = [{"name": "w", "dtype": "float32", "shape": [2, 3], "frame": 0, "offset": 0, "nbytes": 24},
               {"name": "b", "dtype": "bfloat16", "shape": [4], "frame": 1, "offset": 0, "nbytes": 8},
               {"name": "c", "dtype": "float16", "shape": [2], "frame": 1, "offset": 8, "nbytes": 4}]
    r = c.utility("update_weights", tensors=tensors, frames=[w, bytes(12)])
    assert r.ok and r.result == {"tensors": 3, "bytes": 36}
    bad = [{**tensors[0], "nbytes": 20}]
    r = c.utility("update_weights", tensors=bad, frames=[w])
    assert not r.ok and "tensors[0] ('w'): nbytes 20 != 6 elements of shape [2, 3] x 4 bytes (float32)" in r.error
    r = c.utility("update_weights", tensors=tensors, frames=[w])
    assert not r.ok and "frame 1 is not one of the call's 1 raw frame(s)" in (r.error or "")
    assert c.utility("weight_version").result == version  # not before finish
    assert c.utility("finish_weight_update", version=f"{version}+1").result == {"version": f"{version}+1"}
    assert c.utility("weight_version").result == f"{version}+1"
    assert c.utility("stats").result["weight_update_open"] is False


def test_an_update_its_client_abandoned_is_finished_by_another(connect) -> None:  # type: ignore[no-untyped-def]
    other, trainer = connect(), connect()
    assert trainer.utility("start_weight_update").ok
    r = trainer.utility("update_weights", tensors=[{"name": "w", "dtype": "float32", "shape": [2], "frame": 0,
                                                    "offset": 0, "nbytes": 8}], frames=[bytes(8)])
    assert r.ok, r.error
    trainer.close()  # gone mid-update: the update stays open
    assert "already open" in (other.utility("start_weight_update").error or "")
    other.generate("during", PROMPT, max_tokens=3)  # the sim has no model to reload: it keeps serving
    assert other.collect(["during"])["during"].finish_reason == "length"
    assert other.utility("finish_weight_update", version="recovered").ok
    assert other.utility("weight_version").result == "recovered"
    assert other.utility("stats").result["weight_update_open"] is False


def test_a_request_with_a_loaded_lora_samples_other_tokens(connect, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = connect()
    assert c.utility("add_lora", name="ad", path=str(tmp_path)).ok is False  # not an adapter directory
    assert c.utility("add_lora", name="ad", path=str(fake_adapter(tmp_path))).result is True
    assert c.utility("list_loras").result == ["ad"]
    for rid, lora in (("base", None), ("lora", "ad"), ("lora2", "ad")):
        c.send(GenerateRequest(rid, PROMPT, SamplingParams(max_tokens=8, seed=5), 0.0, lora=lora))
    done = c.collect(["base", "lora", "lora2"])
    assert done["lora"].token_ids != done["base"].token_ids
    assert done["lora"].token_ids == done["lora2"].token_ids
    assert c.utility("remove_lora", name="ad").result is True
    assert c.utility("list_loras").result == []
