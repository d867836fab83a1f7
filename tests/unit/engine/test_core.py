"""The core loop against fakes at its two ports (bridge and backend): fatal errors, abort finish,
request-id isolation between peers, drain. Real sockets are covered by tests/integration."""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from protocol import (
    Abort,
    EngineDead,
    GenerateRequest,
    Outputs,
    Ready,
    Reject,
    RequestOutput,
    SamplingParams,
    Stats,
    UtilityCall,
    UtilityResult,
    decode,
    encode,
    make_hello,
)
from protocol.logprobs import Buffer
from services.engine.backend import BackendInfo, Load, ModelBroken, StepResult
from services.engine.config import EngineConfig
from services.engine.core import CoreLoop
from services.engine.weights import WeightSession


class FakeBridge:
    pub_port = 5655

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent: list[tuple[bytes, Any]] = []
        self.raw: list[tuple[bytes, list[bytes]]] = []  # each message's raw frames, in send order
        self.published: list[Any] = []
        self.calls: list[list[tuple[bytes, Any]]] = []  # each send call's messages: what leaves together

    def push(self, identity: bytes, msg: Any) -> None:
        self.inbox.put((identity, [_Frame(f) for f in encode(msg)]))

    def send(self, batch: list[tuple[bytes, Any]]) -> None:
        self.calls.append([(identity, decode(frames)) for identity, frames in batch])
        self.sent += self.calls[-1]
        self.raw += [(identity, [bytes(f) for f in frames[2:]]) for identity, frames in batch]

    def publish(self, batch: list[Any]) -> None:
        self.published += [decode(f) for f in batch]

    def to(self, identity: bytes, kind: type) -> list[Any]:
        return [m for i, m in self.sent if i == identity and isinstance(m, kind)]


class _Frame:
    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


class EchoBackend:
    """Emits one token per running request per step; finishes at max_tokens; can be made to fail."""

    info = BackendInfo("fake", "0", "m", 64, 16, 8, 100, None)

    def __init__(self) -> None:
        self.running: dict[str, list[int]] = {}
        self.fail_with: Exception | None = None
        self.aborted: list[str] = []
        self.shut = False
        self.preemptions = 0

    def add(self, rid: str, req: GenerateRequest) -> None:
        self.running[rid] = [0, req.sampling.max_tokens]

    def abort(self, ids: list[str]) -> None:
        self.aborted += ids
        for i in ids:
            self.running.pop(i, None)

    def has_work(self) -> bool:
        return bool(self.running) or self.fail_with is not None

    def step(self) -> StepResult:
        if self.fail_with is not None:
            raise self.fail_with
        outs = []
        for rid, state in list(self.running.items()):
            state[0] += 1
            done = state[0] >= state[1]
            outs.append(RequestOutput(rid, [state[0]], "length" if done else None))
            if done:
                del self.running[rid]
        return StepResult(outs, num_tokens=len(outs))

    def load(self) -> Load:
        return Load(len(self.running), 0, 0.0, num_preemptions=self.preemptions)

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        raise ValueError("nope")

    def shutdown(self) -> None:
        self.shut = True


def _req(rid: str, max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens), 0.0)


def _run(core: CoreLoop) -> tuple[threading.Thread, list[int]]:
    code: list[int] = []
    t = threading.Thread(target=lambda: code.append(core.run()), daemon=True)
    t.start()
    return t, code


@pytest.fixture
def parts() -> tuple[FakeBridge, EchoBackend, CoreLoop]:
    bridge, backend = FakeBridge(), EchoBackend()
    config = EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, client_timeout_s=30,
                          drain_timeout_s=5)
    return bridge, backend, CoreLoop(config, backend, bridge, vocab_size=100)  # type: ignore[arg-type]


def _wait(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if pred():
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def test_fatal_backend_error_sends_engine_dead_and_exits_1(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"b", make_hello("fe-b"))
    thread, code = _run(core)
    _wait(lambda: len(bridge.to(b"b", Ready)) == 1)
    backend.fail_with = RuntimeError("CUDA error: device lost")
    thread.join(5)
    assert code == [1] and backend.shut
    for peer in (b"a", b"b"):
        dead = bridge.to(peer, EngineDead)
        assert len(dead) == 1 and "CUDA error: device lost" in dead[0].reason


def test_same_request_id_from_two_peers_and_abort_finish(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    for peer in (b"a", b"b"):
        bridge.push(peer, make_hello(peer.decode()))
    bridge.push(b"a", _req("r", 10**9))  # never finishes by itself
    bridge.push(b"b", _req("r", 2))
    thread, _ = _run(core)
    _wait(lambda: any(o.finish_reason for m in bridge.to(b"b", Outputs) for o in m.outputs))
    bridge.push(b"a", Abort(["r"]))
    _wait(lambda: any(o.finish_reason == "abort" for m in bridge.to(b"a", Outputs) for o in m.outputs))
    b_tokens = [t for m in bridge.to(b"b", Outputs) for o in m.outputs for t in o.new_token_ids]
    assert b_tokens == [1, 2]  # b's request was never touched by a's abort
    assert backend.aborted == ["1:r"]
    core.request_drain()
    thread.join(5)


def test_each_aborted_request_is_one_log_line_saying_why(parts, caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    for peer in (b"a", b"b"):
        bridge.push(peer, make_hello(f"fe-{peer.decode()}"))
    bridge.push(b"a", _req("asked", 10**9))
    bridge.push(b"b", _req("orphan-1", 10**9))
    bridge.push(b"b", _req("orphan-2", 10**9))
    thread, _ = _run(core)
    _wait(lambda: len(bridge.to(b"b", Outputs)) > 0)
    with caplog.at_level("INFO", logger="services.engine.core"):
        bridge.push(b"a", Abort(["asked"]))
        bridge.push(b"b", make_hello("fe-b"))  # the same connection handshakes again: its old session ends
        _wait(lambda: sorted(backend.aborted) == ["1:asked", "2:orphan-1", "2:orphan-2"])
        core.request_drain()
        thread.join(5)
    lines = sorted(r.getMessage() for r in caplog.records if "aborted request" in r.getMessage())
    assert lines == ["rank 0 aborted request asked of frontend fe-a: the frontend aborted it",
                     "rank 0 aborted request orphan-1 of frontend fe-b: its frontend started a new session",
                     "rank 0 aborted request orphan-2 of frontend fe-b: its frontend started a new session"]


def test_utility_error_is_a_result_not_a_crash(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, _, core = parts
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", UtilityCall(1, "reset_prefix_cache", {}))
    bridge.push(b"a", UtilityCall(2, "pause", {}))
    thread, _ = _run(core)
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 2)
    first, second = bridge.to(b"a", UtilityResult)
    assert (first.ok, first.error) == (False, "ValueError: nope") and second.ok
    core.request_drain()
    thread.join(5)


def test_drain_deadline_fails_leftovers_then_exits_0(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    object.__setattr__(core.config, "drain_timeout_s", 0.05)
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("stuck"))
    bridge.push(b"a", UtilityCall(1, "pause", {}))  # paused in place: the request can never finish
    thread, code = _run(core)
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 1)
    core.request_drain()
    thread.join(5)
    assert code == [0]
    errors = [o for m in bridge.to(b"a", Outputs) for o in m.outputs if o.finish_reason == "error"]
    assert len(errors) == 1 and "drain deadline" in (errors[0].error or "")
    assert errors[0].error_kind == "draining"  # nothing generated yet: another rank may still serve it
    assert "drained" in bridge.to(b"a", EngineDead)[0].reason


def test_refusals_say_whose_fault_they_are(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, _, core = parts
    object.__setattr__(core.config, "drain_timeout_s", 0.3)
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", UtilityCall(1, "pause", {}))  # paused: the first request keeps the rank draining
    bridge.push(b"a", _req("held"))
    bridge.push(b"a", GenerateRequest("bad", [1, 10**9], SamplingParams(max_tokens=3), 0.0))
    bridge.push(b"a", _req("held"))  # a request id already in flight here
    thread, _ = _run(core)
    _wait(lambda: len([o for m in bridge.to(b"a", Outputs) for o in m.outputs]) == 2)
    core.request_drain()
    bridge.push(b"a", _req("late"))
    _wait(lambda: any(o.request_id == "late" for m in bridge.to(b"a", Outputs) for o in m.outputs))
    thread.join(5)
    kinds = [(o.request_id, o.error_kind) for m in bridge.to(b"a", Outputs) for o in m.outputs
             if o.finish_reason == "error"]
    # The bad token id and the duplicate id are the request's fault; the rank draining is not.
    assert sorted(kinds) == [("bad", "invalid"), ("held", "draining"), ("held", "invalid"), ("late", "draining")]


def test_a_backend_exception_on_add_is_a_request_error_not_a_dead_rank(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts

    def explode(rid: str, req: GenerateRequest) -> None:
        raise RuntimeError("VLLMValidationError: temperature must be in [0, 2]")

    backend.add = explode  # type: ignore[method-assign]
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("bad"))
    thread, code = _run(core)
    _wait(lambda: any(o.finish_reason == "error" for m in bridge.to(b"a", Outputs) for o in m.outputs))
    (out,) = [o for m in bridge.to(b"a", Outputs) for o in m.outputs]
    assert "temperature must be in [0, 2]" in (out.error or "") and out.error_kind == "engine"
    assert bridge.to(b"a", EngineDead) == []
    core.request_drain()
    thread.join(5)
    assert code == [0]


def test_packed_logprobs_of_each_peer_travel_in_one_raw_frame_with_their_offsets(parts) -> None:  # type: ignore[no-untyped-def]
    from protocol import PackedLogprobs
    from protocol.logprobs import pack, unpack

    bridge, _, core = parts
    for peer in (b"a", b"b"):
        bridge.push(peer, make_hello(peer.decode()))
    core._take_input(0.0)  # the handshakes, on this thread: no loop runs
    assert len(bridge.to(b"b", Ready)) == 1
    core._peers.own(core._peers.get(b"a"), "1:x", "x")
    core._peers.own(core._peers.get(b"a"), "1:y", "y")
    core._peers.own(core._peers.get(b"b"), "2:z", "z")
    outs = [RequestOutput("1:x", [5]), RequestOutput("1:y", [6]), RequestOutput("2:z", [7]), RequestOutput("1:w", [8])]
    segments = {}
    for out, token in zip(outs[:3], (5, 6, 7), strict=True):
        out.packed_logprobs = PackedLogprobs(9, 9, 1, 1)
        segments[out.request_id] = [(out.packed_logprobs, [pack([token, token + 1], [-0.5, -0.25], [2])])]
    prompt = PackedLogprobs(9, 9, 2, 0)
    outs[1].packed_prompt_logprobs = prompt
    segments["1:y"].insert(0, (prompt, [memoryview(pack([1, 2], [-3.0, -4.0], [10, 20]))]))
    core._deliver(outs, segments)  # 1:w has no owner (aborted meanwhile): dropped with no segment
    for peer, expected in ((b"a", {"x": [5], "y": [6]}), (b"b", {"z": [7]})):
        sent = [(m, raw) for (i, m), (j, raw) in zip(bridge.sent, bridge.raw, strict=True)
                if i == peer and isinstance(m, Outputs) and m.outputs]
        assert len(sent) == 1
        msg, raw = sent[0]
        assert len(raw) == 1 and {o.request_id: o.new_token_ids for o in msg.outputs} == expected
        for o in msg.outputs:
            seg = unpack(raw, o.packed_logprobs)
            assert list(seg.token_ids) == [o.new_token_ids[0], o.new_token_ids[0] + 1] and list(seg.ranks) == [2]
            if o.request_id == "y":
                p = unpack(raw, o.packed_prompt_logprobs)
                assert (list(p.token_ids), list(p.logprobs), list(p.ranks)) == ([1, 2], [-3.0, -4.0], [10, 20])


def test_pooled_arrays_share_the_peer_raw_frame_with_logprob_segments(parts) -> None:  # type: ignore[no-untyped-def]
    from protocol import PackedLogprobs, PackedPooled
    from protocol import pooled as pooled_codec
    from protocol.logprobs import pack, unpack

    bridge, _, core = parts
    bridge.push(b"a", make_hello("a"))
    core._take_input(0.0)
    for rid in ("x", "v", "m"):
        core._peers.own(core._peers.get(b"a"), f"1:{rid}", rid)
    gen = RequestOutput("1:x", [5], packed_logprobs=PackedLogprobs(9, 9, 1, 1))
    vec = RequestOutput("1:v", [], "stop", pooled=PackedPooled(9, 9, [3]))
    rows = RequestOutput("1:m", [], "stop", pooled=PackedPooled(9, 9, [2, 2]))
    segments = {"1:x": [(gen.packed_logprobs, [pack([5, 6], [-0.5, -0.25], [2])])]}
    pooled = {"1:v": (vec.pooled, pooled_codec.pack([0.5, -1.0, 2.0])),
              "1:m": (rows.pooled, memoryview(pooled_codec.pack([1.0, 2.0, 3.0, 4.0])))}
    core._deliver([gen, vec, rows], segments, pooled)
    (msg, raw), = [(m, r) for (i, m), (j, r) in zip(bridge.sent, bridge.raw, strict=True)
                   if isinstance(m, Outputs) and m.outputs]
    assert len(raw) == 1
    got = {o.request_id: o for o in msg.outputs}
    assert list(unpack(raw, got["x"].packed_logprobs).token_ids) == [5, 6]
    assert pooled_codec.to_list(raw, got["v"].pooled) == [0.5, -1.0, 2.0]
    assert pooled_codec.to_list(raw, got["m"].pooled) == [[1.0, 2.0], [3.0, 4.0]]
    assert got["v"].pooled.offset > 0 and got["m"].pooled.offset % 4 == 0  # after the segment, aligned


def test_stats_carry_the_preemptions_and_the_steps_by_their_tokens(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    backend.preemptions = 7
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("one", 3))
    bridge.push(b"a", _req("two", 2))
    thread, _ = _run(core)
    # Three steps with outputs: 2 tokens, 2 tokens, then 1; Stats count them per bucket, cumulative.
    _wait(lambda: any(s.iteration_tokens_sum == 5 for s in bridge.to(b"a", Stats)))
    stats = bridge.to(b"a", Stats)[-1]
    assert stats.num_preemptions == 7
    assert stats.iteration_tokens == [1, 2] + [0] * 12 and stats.iteration_tokens_sum == 5
    core.request_drain()
    thread.join(5)


class SlowStepBackend(EchoBackend):
    """Each step takes (simulated) 30 ms: longer than the 10 ms heartbeat interval of these tests."""

    def step(self) -> StepResult:
        return dataclasses.replace(super().step(), duration_s=0.03)


def test_a_heartbeat_due_during_a_step_leaves_with_the_step_outputs_in_one_send() -> None:
    """A frontend reads a step's outputs and the Stats that fell due meanwhile in one wake-up: they are
    handed to the socket thread together, not as two sends it may write apart."""
    bridge, backend = FakeBridge(), SlowStepBackend()
    core = CoreLoop(EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, client_timeout_s=30),
                    backend, bridge, vocab_size=100)  # type: ignore[arg-type]
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"b", make_hello("fe-b"))
    bridge.push(b"a", _req("r", 6))
    thread, _ = _run(core)
    _wait(lambda: any(o.finish_reason for m in bridge.to(b"a", Outputs) for o in m.outputs))
    core.request_drain()
    thread.join(5)
    with_outputs = [i for i, call in enumerate(bridge.calls) if any(isinstance(m, Outputs) for _, m in call)]
    assert len(with_outputs) == 6
    stepping = bridge.calls[with_outputs[0]:with_outputs[-1] + 1]
    stats_calls = [call for call in stepping if any(isinstance(m, Stats) for _, m in call)]
    assert len(stats_calls) >= 5  # a beat was due at the end of each step
    for call in stats_calls:  # each with the step's outputs, and every peer's Stats (b has no outputs)
        assert [(i, type(m)) for i, m in call] == [(b"a", Outputs), (b"a", Stats), (b"b", Stats)]


class FramesBackend(EchoBackend):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict[str, Any], list[bytes]]] = []

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        self.calls.append((name, args, [bytes(f) for f in frames]))
        return len(frames)


def test_a_utility_call_gets_its_raw_frames_and_its_defaults() -> None:
    bridge, backend = FakeBridge(), FramesBackend()
    core = CoreLoop(EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01), backend, bridge,  # type: ignore[arg-type]
                    vocab_size=100)
    bridge.push(b"a", make_hello("fe-a"))
    call = UtilityCall(1, "update_weights", {"tensors": []})
    bridge.inbox.put((b"a", [_Frame(f) for f in encode(call, b"abc", b"de")]))
    bridge.push(b"a", UtilityCall(2, "pause", {}))
    thread, _ = _run(core)
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 2)
    assert backend.calls == [("update_weights", {"tensors": []}, [b"abc", b"de"])]
    assert [r.result for r in bridge.to(b"a", UtilityResult)] == [2, {"paused": True, "mode": "keep", "aborted": 0}]
    core.request_drain()
    thread.join(5)


class UpdatingBackend(EchoBackend):
    """A model that cannot run while a weight update is open (vllm's layers are on the meta device then),
    or, with `runs=True`, one that can (the sim)."""

    def __init__(self, *, runs: bool = False) -> None:
        super().__init__()
        self.info = dataclasses.replace(EchoBackend.info, runs_during_weight_update=runs)
        self.weights = WeightSession()
        self.steps = 0
        self.steps_while_open = 0

    def step(self) -> StepResult:
        self.steps += 1
        self.steps_while_open += self.weights.open
        return super().step()

    broken = False  # finish finds the model half-loaded

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        if name == "start_weight_update":
            self.weights.start()
            return True
        assert name == "finish_weight_update", name
        if self.broken:
            raise ModelBroken("finish_weight_update: the model is half-loaded")
        return self.weights.finish(args["version"])


def test_nothing_steps_while_a_weight_update_is_open_on_a_model_that_cannot_run_paused_or_not() -> None:
    bridge, backend = FakeBridge(), UpdatingBackend()
    core = CoreLoop(EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01), backend, bridge,  # type: ignore[arg-type]
                    vocab_size=100)
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("kept", 10**9))
    thread, code = _run(core)
    _wait(lambda: len(bridge.to(b"a", Outputs)) > 0)
    # Not paused (vLLM leaves the pause to its caller): nothing is refused, and nothing steps.
    bridge.push(b"a", UtilityCall(1, "start_weight_update", {}))
    bridge.push(b"a", _req("new", 2))
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 1)
    assert bridge.to(b"a", UtilityResult)[0].ok and backend.weights.open
    steps, beats = backend.steps, len(bridge.to(b"a", Stats))
    _wait(lambda: len(bridge.to(b"a", Stats)) >= beats + 3)  # loop turns, each may have stepped
    assert backend.steps == steps and thread.is_alive() and not bridge.to(b"a", EngineDead)
    # A pause and a resume in between change nothing for the model either.
    for msg in (UtilityCall(2, "pause", {"mode": "keep"}), UtilityCall(3, "resume", {})):
        bridge.push(b"a", msg)
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 3)
    beats = len(bridge.to(b"a", Stats))
    _wait(lambda: len(bridge.to(b"a", Stats)) >= beats + 3)
    assert backend.steps == steps
    bridge.push(b"a", UtilityCall(4, "finish_weight_update", {"version": "v1"}))
    _wait(lambda: any(o.request_id == "new" and o.finish_reason == "length"
                      for m in bridge.to(b"a", Outputs) for o in m.outputs))
    assert backend.steps > steps and backend.steps_while_open == 0
    bridge.push(b"a", Abort(["kept"]))
    core.request_drain()
    thread.join(5)
    assert code == [0]


def _updating_core(**config: Any) -> tuple[FakeBridge, UpdatingBackend, CoreLoop, threading.Thread, list[int]]:
    """A core over a model that cannot run during an update, with a peer `a` whose request `kept` runs
    and a weight update started by peer `b`."""
    bridge, backend = FakeBridge(), UpdatingBackend()
    core = CoreLoop(EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, **config), backend,  # type: ignore[arg-type]
                    bridge, vocab_size=100)
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"b", make_hello("fe-b"))
    bridge.push(b"a", _req("kept", 10**9))
    thread, code = _run(core)
    _wait(lambda: len(bridge.to(b"a", Outputs)) > 0)
    bridge.push(b"b", UtilityCall(1, "start_weight_update", {}))
    _wait(lambda: len(bridge.to(b"b", UtilityResult)) == 1 and backend.weights.open)
    return bridge, backend, core, thread, code


def test_a_wait_pause_that_could_never_finish_is_refused_during_an_update() -> None:
    bridge, backend, core, thread, code = _updating_core()
    bridge.push(b"b", UtilityCall(2, "pause", {"mode": "wait"}))
    _wait(lambda: len(bridge.to(b"b", UtilityResult)) == 2)
    refused = bridge.to(b"b", UtilityResult)[1]
    assert not refused.ok and "pause(mode='wait') cannot finish while a weight update is open" in (refused.error or "")
    bridge.push(b"b", UtilityCall(3, "pause", {"mode": "keep"}))  # keep and abort still work
    _wait(lambda: len(bridge.to(b"b", UtilityResult)) == 3 and bridge.to(b"b", UtilityResult)[2].ok)
    bridge.push(b"b", UtilityCall(4, "finish_weight_update", {"version": "v1"}))
    bridge.push(b"b", UtilityCall(5, "pause", {"mode": "wait"}))  # finished: a wait pause can end again
    bridge.push(b"a", Abort(["kept"]))
    _wait(lambda: len(bridge.to(b"b", UtilityResult)) == 5 and all(r.ok for r in bridge.to(b"b", UtilityResult)[3:]))
    core.request_drain()
    thread.join(5)
    assert code == [0]


def test_a_drain_during_an_update_ends_the_held_requests_at_once() -> None:
    bridge, backend, core, thread, code = _updating_core(drain_timeout_s=600.0)
    core.request_drain()
    thread.join(5)  # not the 600 s drain deadline: nothing could finish
    assert code == [0] and backend.steps_while_open == 0
    [out] = [o for m in bridge.to(b"a", Outputs) for o in m.outputs if o.request_id == "kept" and o.finish_reason]
    assert out.finish_reason == "error" and "drain deadline" in (out.error or "")


@pytest.mark.parametrize(("how", "says"), [("closed", "left before finish_weight_update"),
                                           ("quiet", "had no call for"), ("broken", "half-loaded")])
def test_an_update_left_half_loaded_fails_the_rank(how: str, says: str) -> None:
    """The update's client leaves before finish (its connection closes), no call comes for
    --weight-update-timeout, or the backend says the model cannot be trusted: the rank fails, as on a
    backend failure, instead of holding its requests forever."""
    bridge, backend, core, thread, code = _updating_core(weight_update_timeout_s=0.3 if how == "quiet" else 600.0)
    if how == "closed":
        bridge.inbox.put((b"b", []))  # the bridge: a send to it found no connection
    elif how == "broken":
        backend.broken = True
        bridge.push(b"b", UtilityCall(2, "finish_weight_update", {"version": "v1"}))
    thread.join(5)
    assert code == [1] and backend.steps_while_open == 0
    [dead] = bridge.to(b"a", EngineDead)
    assert says in dead.reason


def test_a_model_that_runs_during_an_update_keeps_stepping() -> None:
    bridge, backend = FakeBridge(), UpdatingBackend(runs=True)
    core = CoreLoop(EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01), backend, bridge,  # type: ignore[arg-type]
                    vocab_size=100)
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", UtilityCall(1, "start_weight_update", {}))
    bridge.push(b"a", _req("during", 3))
    thread, code = _run(core)
    _wait(lambda: any(o.request_id == "during" and o.finish_reason == "length"
                      for m in bridge.to(b"a", Outputs) for o in m.outputs))
    assert backend.weights.open and backend.steps_while_open > 0
    core.request_drain()
    thread.join(5)
    assert code == [0]


def test_a_request_held_by_a_pause_is_refused_as_draining_when_the_rank_drains(parts) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", UtilityCall(1, "pause", {"mode": "abort"}))
    bridge.push(b"a", _req("held"))
    thread, code = _run(core)
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 1)
    core.request_drain()
    thread.join(5)
    assert code == [0] and backend.running == {}
    [out] = [o for m in bridge.to(b"a", Outputs) for o in m.outputs]
    assert (out.request_id, out.finish_reason, out.error_kind) == ("held", "error", "draining")
    assert "while paused" in (out.error or "")


def test_a_closed_connection_aborts_its_requests_at_once(parts, caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("r", 10**9))
    thread, _ = _run(core)
    _wait(lambda: len(bridge.to(b"a", Outputs)) > 0)
    with caplog.at_level("INFO", logger="services.engine.core"):
        bridge.inbox.put((b"a", []))  # the bridge: a send to it found no connection
        _wait(lambda: backend.aborted == ["1:r"])
    assert "rank 0: frontend fe-a closed its connection; aborting its 1 request(s)" in caplog.text
    assert core.bridge.peers == ()
    bridge.push(b"a", UtilityCall(7, "stats", {}))  # its session is gone: a new connection must handshake
    _wait(lambda: len(bridge.to(b"a", Reject)) == 1)
    core.request_drain()
    thread.join(5)


def test_hello_retries_of_one_session_get_one_ready_and_one_log_line(parts, caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, _, core = parts
    for _ in range(50):  # what queues while a rank loads: the frontend retries every 0.5 s
        bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", UtilityCall(1, "stats", {}))
    with caplog.at_level("INFO", logger="services.engine.core"):
        thread, _ = _run(core)
        _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 1)
        assert len(bridge.to(b"a", Ready)) == 1
        assert bridge.to(b"a", UtilityResult)[0].result["peers"] == 1
        # Once it has spoken, a Hello is a new session (it declared this rank dead, say): answered.
        bridge.push(b"a", make_hello("fe-a"))
        _wait(lambda: len(bridge.to(b"a", Ready)) == 2)
    assert caplog.text.count("accepted frontend fe-a") == 2
    core.request_drain()
    thread.join(5)


def test_a_late_hello_retry_gets_the_same_ready_again(parts, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, _, core = parts
    monkeypatch.setattr("services.engine.core.DUPLICATE_HELLO_S", 0.0)  # every retry counts as late
    with caplog.at_level("INFO", logger="services.engine.core"):
        bridge.push(b"a", make_hello("fe-a"))
        bridge.push(b"a", make_hello("fe-a"))
        thread, _ = _run(core)
        _wait(lambda: len(bridge.to(b"a", Ready)) == 2)
    first, again = bridge.to(b"a", Ready)
    assert first == again  # the same session (epoch): its first Ready may have been lost
    assert caplog.text.count("accepted frontend fe-a") == 1
    core.request_drain()
    thread.join(5)


def test_a_peer_without_a_session_changes_nothing_and_is_logged_once(parts, caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, backend, core = parts
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("r", 10**9))
    calls = [UtilityCall(1, "pause", {"mode": "abort"}), Abort(["r"]), _req("x"),
             UtilityCall(2, "add_lora", {"name": "evil", "path": "/tmp"}), UtilityCall(3, "start_weight_update", {})]
    with caplog.at_level("INFO", logger="services.engine.core"):
        thread, _ = _run(core)
        _wait(lambda: len(bridge.to(b"a", Outputs)) > 0)
        for msg in calls:
            bridge.push(b"x", msg)
        bridge.push(b"y", make_hello("fe-y", "a token nobody asked for"))  # accepted: this engine asks none
        _wait(lambda: len(bridge.to(b"x", Reject)) == len(calls) and bridge.to(b"y", Ready))
    assert all("no session on this connection" in r.reason for r in bridge.to(b"x", Reject))
    assert caplog.text.count("refused messages from b'x'") == 1
    assert backend.aborted == [] and list(backend.running) == ["1:r"] and core._pause_mode is None
    core.request_drain()
    thread.join(5)


def test_a_refused_hello_is_answered_each_time_and_logged_once(caplog) -> None:  # type: ignore[no-untyped-def]
    bridge, backend = FakeBridge(), EchoBackend()
    config = EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, auth_token="s3cret")
    core = CoreLoop(config, backend, bridge, vocab_size=100)  # type: ignore[arg-type]
    for token in (None, "wrong", "wrong"):
        bridge.push(b"x", make_hello("fe-x", token))
    bridge.push(b"x", UtilityCall(1, "pause", {}))
    bridge.push(b"a", make_hello("fe-a", "s3cret"))
    with caplog.at_level("INFO", logger="services.engine.core"):
        thread, _ = _run(core)
        _wait(lambda: len(bridge.to(b"x", Reject)) == 4 and bridge.to(b"a", Ready))
    assert [r.code for r in bridge.to(b"x", Reject)] == ["unauthorized"] * 3 + ["malformed"]
    assert caplog.text.count("refused handshake from fe-x") == 1 and core._pause_mode is None
    core.request_drain()
    thread.join(5)


def test_a_stall_of_the_rank_itself_is_not_its_peers_silence() -> None:
    """A step that held the loop past --client-timeout (the process stopped, a long prefill): the peers'
    heartbeats queued meanwhile are unread, so the rank must not reap them as silent (a peer silent in real
    time is reaped: tests/integration/test_engine_sim.py)."""
    offset = [0.0]
    clock = lambda: time.monotonic() + offset[0]  # noqa: E731

    class StallingBackend(EchoBackend):
        def step(self) -> StepResult:
            if "1:stall" in self.running:
                offset[0] += 60.0  # a minute away from the loop, twice the client timeout
                self.running.pop("1:stall")
                return StepResult([RequestOutput("1:stall", [1], "length")], num_tokens=1)
            return super().step()

    bridge, backend = FakeBridge(), StallingBackend()
    config = EngineConfig(model="m", backend="sim", heartbeat_interval_s=0.01, client_timeout_s=30,
                          drain_timeout_s=5)
    core = CoreLoop(config, backend, bridge, vocab_size=100, clock=clock)  # type: ignore[arg-type]
    bridge.push(b"a", make_hello("fe-a"))
    bridge.push(b"a", _req("stall"))
    thread, _ = _run(core)
    _wait(lambda: any(o.finish_reason == "length" for m in bridge.to(b"a", Outputs) for o in m.outputs))
    beats = len(bridge.to(b"a", Stats))
    _wait(lambda: len(bridge.to(b"a", Stats)) > beats + 3)  # heartbeats went on after the stall
    assert bridge.to(b"a", Reject) == []  # the session outlived the rank's own minute away
    bridge.push(b"a", UtilityCall(1, "stats", {}))
    _wait(lambda: len(bridge.to(b"a", UtilityResult)) == 1)
    core.request_drain()
    thread.join(5)
