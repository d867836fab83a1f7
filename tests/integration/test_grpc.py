"""The frontend's gRPC services over a sim fleet (two headless sim ranks, a frontend with --grpc-port
and --api-key), driven by the client generated from protocol/grpc/fleet/v1/fleet.proto: Inference
equals the HTTP token-in route for the same request, Control and RlControl reach every rank, KvEvents
relays the engines' KV events and resumes without gaps, auth, health and reflection."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protocol.block_hash import block_hashes
from protocol.grpc import pb2, tensor_messages
from tests.integration.conftest import SIM
from tests.support.adapters import fake_adapter
from tests.support.grpc_fleet import Fleet, running
from tests.support.procs import free_port_block, start_engine, start_frontend

KEY = "grpc-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
PROMPT = list(range(100, 140))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running(tmp_path_factory.mktemp("grpc"), [*SIM, "--sim-decode-ms", "5"], ["--api-key", KEY], ranks=2) as f:
        yield f


def _req(**kw: Any) -> Any:
    sampling = kw.pop("sampling", {})
    return pb2.GenerateRequest(token_ids=kw.pop("token_ids", PROMPT),
                               sampling_params=pb2.SamplingParams(**{"max_tokens": 12, "temperature": 0.0,
                                                                     **sampling}), **kw)


def _http(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(fleet.frontend.url + "/inference/v1/generate", json=body, timeout=30,
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# ---- Inference ---------------------------------------------------------------------------------------


def test_generate_equals_the_http_token_in_route(fleet: Fleet) -> None:
    resp = fleet.inference.Generate(_req(request_id="mine", return_text=True, sampling={"seed": 7,
                                                                                       "temperature": 0.8}),
                                    metadata=AUTH, timeout=30)
    http = _http(fleet, {"token_ids": PROMPT, "return_text": True,
                         "sampling_params": {"max_tokens": 12, "temperature": 0.8, "seed": 7}})
    choice = http["choices"][0]
    assert resp.request_id == "mine"
    assert list(resp.token_ids) == choice["token_ids"]
    assert resp.text == choice["text"]
    assert resp.finish_reason == choice["finish_reason"] == "length"
    assert resp.usage.prompt_tokens == len(PROMPT) == http["usage"]["prompt_tokens"]
    assert resp.usage.completion_tokens == 12
    assert resp.data_parallel_rank in (0, 1)


def test_a_long_request_is_parsed_off_the_loop_and_answers_the_same(fleet: Fleet) -> None:
    long = [(i * 7919) % 150_000 for i in range(3000)]  # past --long-prompt-chars: parsed in a worker process
    resp = fleet.inference.Generate(_req(token_ids=long, lora_name="", sampling={"seed": 1, "temperature": 1.0}),
                                    metadata=AUTH, timeout=60)
    http = _http(fleet, {"token_ids": long, "sampling_params": {"max_tokens": 12, "temperature": 1.0, "seed": 1}})
    assert list(resp.token_ids) == http["choices"][0]["token_ids"] and resp.usage.prompt_tokens == 3000
    with pytest.raises(grpc.RpcError) as err:  # refused in the worker: the message names the field
        fleet.inference.Generate(_req(token_ids=[*long, 10_000_000]), metadata=AUTH, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "token_ids[3000]" in err.value.details()


def test_generate_stream_sends_the_same_tokens_in_pieces(fleet: Fleet) -> None:
    unary = fleet.inference.Generate(_req(sampling={"seed": 3, "temperature": 1.0, "max_tokens": 20}),
                                     metadata=AUTH, timeout=30)
    chunks = list(fleet.inference.GenerateStream(_req(sampling={"seed": 3, "temperature": 1.0, "max_tokens": 20}),
                                                 metadata=AUTH, timeout=30))
    assert len(chunks) > 1
    assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
    assert all(c.finish_reason == "" for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 20


def test_logprobs_match_the_http_route(fleet: Fleet) -> None:
    resp = fleet.inference.Generate(_req(sampling={"logprobs": 3, "prompt_logprobs": 2, "max_tokens": 5}),
                                    metadata=AUTH, timeout=30)
    http = _http(fleet, {"token_ids": PROMPT, "sampling_params": {"max_tokens": 5, "temperature": 0.0,
                                                                  "logprobs": 3, "prompt_logprobs": 2}})
    content = http["choices"][0]["logprobs"]["content"]
    assert len(resp.logprobs) == len(content) == 5
    for got, want in zip(resp.logprobs, content, strict=True):
        assert got.token_id == want["token_id"]
        assert got.logprob == pytest.approx(max(want["logprob"], -9999.0), rel=1e-6)
        assert len(got.top_logprobs) == 3
    assert len(resp.prompt_logprobs) == len(PROMPT) - 1
    assert [p.token_id for p in resp.prompt_logprobs] == PROMPT[1:]
    streamed = list(fleet.inference.GenerateStream(_req(sampling={"logprobs": 1, "max_tokens": 5}), metadata=AUTH,
                                                   timeout=30))
    assert sum(len(c.logprobs) for c in streamed) == sum(len(c.token_ids) for c in streamed) == 5


def test_stop_strings_and_stop_tokens_as_http(fleet: Fleet) -> None:
    base = fleet.inference.Generate(_req(return_text=True, sampling={"max_tokens": 16}), metadata=AUTH, timeout=30)
    stop_token = base.token_ids[4]
    resp = fleet.inference.Generate(_req(sampling={"max_tokens": 16, "stop_token_ids": [stop_token]}),
                                    metadata=AUTH, timeout=30)
    assert resp.finish_reason == "stop" and resp.stop_token_id == stop_token
    assert list(resp.token_ids) == list(base.token_ids[:list(base.token_ids).index(stop_token) + 1])
    word = base.text[len(base.text) // 2:][:3]
    if word.strip():
        text = fleet.inference.Generate(_req(return_text=True, sampling={"max_tokens": 16, "stop": [word]}),
                                        metadata=AUTH, timeout=30)
        assert text.finish_reason == "stop" and text.stop_string == word and word not in text.text


@pytest.mark.parametrize(("sampling", "field"), [
    ({"temperature": -1.0}, "sampling_params.temperature"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
    ({"logprobs": 10_000}, "sampling_params.logprobs"),
    ({"max_tokens": 10_000_000}, "sampling_params.max_tokens"),
    ({"stop_token_ids": [10_000_000]}, "sampling_params.stop_token_ids[0]"),
])
def test_bad_sampling_is_invalid_argument_naming_the_field(fleet: Fleet, sampling: dict[str, Any], field: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        fleet.inference.Generate(_req(sampling=sampling), metadata=AUTH, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


def test_bad_prompt_and_pin_are_refused(fleet: Fleet) -> None:
    for req, field in ((_req(token_ids=[]), "token_ids"), (_req(token_ids=[1, 10_000_000]), "token_ids[1]"),
                       (_req(data_parallel_rank=7), "X-Data-Parallel-Rank")):
        with pytest.raises(grpc.RpcError) as err:
            fleet.inference.Generate(req, metadata=AUTH, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert field in err.value.details()
    pinned = fleet.inference.Generate(_req(data_parallel_rank=1), metadata=AUTH, timeout=30)
    assert pinned.data_parallel_rank == 1


def test_a_message_past_the_body_limit_is_refused_unread_on_every_method(fleet: Fleet) -> None:
    """Every method's messages are bounded by --max-body-bytes (4 MiB here), as HTTP bodies are; gRPC refuses
    a larger one from its length prefix, RESOURCE_EXHAUSTED, and a call without the API key is refused
    before its message is read at all (UNAUTHENTICATED, not the size)."""
    limit = fleet.control.GetServerInfo(pb2.GetServerInfoRequest(), metadata=AUTH).max_message_bytes
    assert limit == 4 * 2**20
    big = _req(token_ids=[100_000] * 2_000_000)  # 6 MB
    assert big.ByteSize() > limit
    calls = [lambda md: fleet.inference.Generate(big, metadata=md, timeout=30),
             lambda md: list(fleet.inference.GenerateStream(big, metadata=md, timeout=30)),
             lambda md: fleet.control.LoadLora(pb2.LoadLoraRequest(name="x", path="p" * (limit + 1)), metadata=md,
                                               timeout=30),
             lambda md: fleet.rl.UpdateWeights(iter([pb2.Tensor(name="w", dtype="uint8", shape=[limit + 1],
                                                                data=bytes(limit + 1))]), metadata=md, timeout=30)]
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call(AUTH)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        assert "larger than max" in err.value.details() and f"vs. {limit})" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            call((("authorization", "Bearer wrong"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()


def _in_flight(fleet: Fleet) -> int:
    return sum(r.in_flight for r in fleet.control.GetLoads(pb2.GetLoadsRequest(), metadata=AUTH).ranks)


def _wait(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cancelling_a_stream_aborts_it_at_the_engine(fleet: Fleet) -> None:
    call = fleet.inference.GenerateStream(_req(sampling={"max_tokens": 3000, "ignore_eos": True}), metadata=AUTH,
                                          timeout=60)
    next(call)
    assert _in_flight(fleet) == 1
    call.cancel()
    _wait(lambda: _in_flight(fleet) == 0)
    engine_running = lambda: sum(r.running for r in fleet.control.GetLoads(  # noqa: E731
        pb2.GetLoadsRequest(), metadata=AUTH).ranks)
    _wait(lambda: engine_running() == 0)


def test_a_deadline_ends_the_request_at_the_engine(fleet: Fleet) -> None:
    with pytest.raises(grpc.RpcError) as err:
        fleet.inference.Generate(_req(sampling={"max_tokens": 3000, "ignore_eos": True}), metadata=AUTH, timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait(lambda: _in_flight(fleet) == 0)


def _first_tokens(fleet: Fleet) -> float:
    """How many requests the frontend has seen a first token of (its time-to-first-token histogram)."""
    text = httpx.get(fleet.frontend.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}, timeout=10).text
    found = re.search(r"^vllm:time_to_first_token_seconds_count\{[^}]*\} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_control_abort_ends_a_running_request_with_finish_abort(fleet: Fleet) -> None:
    got: dict[str, Any] = {}

    def run() -> None:
        got["resp"] = fleet.inference.Generate(_req(request_id="to-abort", sampling={"max_tokens": 3000,
                                                                                     "ignore_eos": True}),
                                               metadata=AUTH, timeout=60)

    first_tokens = _first_tokens(fleet)
    t = threading.Thread(target=run)
    t.start()
    _wait(lambda: _in_flight(fleet) == 1)
    _wait(lambda: _first_tokens(fleet) > first_tokens)  # its first token reached the frontend
    aborted = fleet.control.Abort(pb2.AbortRequest(request_ids=["to-abort", "unknown"]), metadata=AUTH)
    t.join(30)
    assert list(aborted.aborted) == ["to-abort"]
    resp = got["resp"]
    assert resp.finish_reason == "abort" and 0 < len(resp.token_ids) < 3000
    _wait(lambda: _in_flight(fleet) == 0)


# ---- Control ---------------------------------------------------------------------------------------


def test_server_and_model_info(fleet: Fleet) -> None:
    info = fleet.control.GetServerInfo(pb2.GetServerInfoRequest(), metadata=AUTH)
    assert info.data_parallel_size == 2 and sorted(info.ready_ranks) == [0, 1]
    assert info.protocol_major == 1 and info.grpc_schema.startswith("fleet.v1:")
    model = fleet.control.GetModelInfo(pb2.GetModelInfoRequest(), metadata=AUTH)
    assert model.served_model_name == "tiny" and model.backend == "sim"
    assert model.max_model_len > 0 and model.block_size > 0 and model.vocab_size > 150_000
    assert len(model.tokenizer_sha256) == 64 and len(model.chat_template_sha256) == 64


def test_loads_report_every_rank(fleet: Fleet) -> None:
    loads = fleet.control.GetLoads(pb2.GetLoadsRequest(), metadata=AUTH)
    assert [(r.rank, r.state) for r in loads.ranks] == [(0, "ready"), (1, "ready")]
    assert all(r.num_kv_blocks > 0 and r.epoch for r in loads.ranks)


def test_reset_prefix_cache_on_every_rank(fleet: Fleet) -> None:
    reset = fleet.control.ResetPrefixCache(pb2.ResetPrefixCacheRequest(), metadata=AUTH)
    assert sorted(reset.reset_ranks) == [0, 1]


def test_lora_load_list_use_unload(fleet: Fleet, tmp_path: Path) -> None:
    fleet.control.LoadLora(pb2.LoadLoraRequest(name="ad1", path=str(fake_adapter(tmp_path))), metadata=AUTH)
    assert "ad1" in fleet.control.ListLoras(pb2.ListLorasRequest(), metadata=AUTH).names
    base = fleet.inference.Generate(_req(), metadata=AUTH, timeout=30)
    adapted = fleet.inference.Generate(_req(lora_name="ad1"), metadata=AUTH, timeout=30)
    assert list(adapted.token_ids) != list(base.token_ids)
    fleet.control.UnloadLora(pb2.UnloadLoraRequest(name="ad1"), metadata=AUTH)
    assert "ad1" not in fleet.control.ListLoras(pb2.ListLorasRequest(), metadata=AUTH).names
    with pytest.raises(grpc.RpcError) as err:
        fleet.inference.Generate(_req(lora_name="ad1"), metadata=AUTH, timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "lora_name 'ad1': no such LoRA adapter is loaded" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        fleet.control.LoadLora(pb2.LoadLoraRequest(name="", path="/x"), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "name" in err.value.details()




# ---- RlControl ---------------------------------------------------------------------------------------


def _stream_in_thread(fleet: Fleet, max_tokens: int, out: list[Any], **kw: Any) -> threading.Thread:
    def run() -> None:
        try:
            out.extend(fleet.inference.GenerateStream(_req(sampling={"max_tokens": max_tokens, "ignore_eos": True},
                                                           **kw), metadata=AUTH, timeout=60))
        except grpc.RpcError as exc:
            out.append(exc)
    t = threading.Thread(target=run)
    t.start()
    return t


def _paused(fleet: Fleet) -> Any:
    return fleet.rl.IsPaused(pb2.IsPausedRequest(), metadata=AUTH)


def test_pause_keep_freezes_in_flight_streams_and_resume_continues(fleet: Fleet) -> None:
    chunks: list[Any] = []
    t = _stream_in_thread(fleet, 200, chunks)
    _wait(lambda: len(chunks) > 0)
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_KEEP), metadata=AUTH)
    assert _paused(fleet).paused and _paused(fleet).mode == pb2.PAUSE_MODE_KEEP
    time.sleep(0.2)
    frozen = len(chunks)
    time.sleep(0.3)
    assert len(chunks) == frozen  # nothing generated while paused
    # A request that arrives while paused waits, and runs after the resume.
    later: list[Any] = []
    t2 = _stream_in_thread(fleet, 5, later)
    _wait(lambda: _paused(fleet).held == 1)
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest(), metadata=AUTH)
    t.join(30)
    t2.join(30)
    assert not _paused(fleet).paused
    assert sum(len(c.token_ids) for c in chunks) == 200 and chunks[-1].finish_reason == "length"
    assert sum(len(c.token_ids) for c in later) == 5


def test_pause_abort_ends_in_flight_streams(fleet: Fleet) -> None:
    chunks: list[Any] = []
    t = _stream_in_thread(fleet, 3000, chunks)
    _wait(lambda: len(chunks) > 0)
    resp = fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_ABORT), metadata=AUTH)
    t.join(30)
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest(), metadata=AUTH)
    assert resp.aborted == 1
    last = chunks[-1]
    assert isinstance(last, grpc.RpcError) or last.finish_reason == "abort"


def test_pause_wait_returns_once_in_flight_requests_finished(fleet: Fleet) -> None:
    chunks: list[Any] = []
    t = _stream_in_thread(fleet, 60, chunks)
    _wait(lambda: len(chunks) > 0)
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_WAIT), metadata=AUTH, timeout=30)
    t.join(5)
    assert not t.is_alive()  # it had finished when the pause returned
    assert chunks[-1].finish_reason == "length" and sum(len(c.token_ids) for c in chunks) == 60
    assert _paused(fleet).paused
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest(), metadata=AUTH)


def test_a_request_held_by_a_pause_is_bounded_by_its_deadline(fleet: Fleet) -> None:
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_KEEP), metadata=AUTH)
    try:
        with pytest.raises(grpc.RpcError) as err:
            fleet.inference.Generate(_req(), metadata=AUTH, timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        _wait(lambda: _paused(fleet).held == 0)  # the abort took it out of the held queue
    finally:
        fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest(), metadata=AUTH)


def test_sleep_and_wake_on_sim(fleet: Fleet) -> None:
    fleet.rl.Sleep(pb2.SleepRequest(level=1), metadata=AUTH)
    assert fleet.rl.IsSleeping(pb2.IsSleepingRequest(), metadata=AUTH).sleeping
    fleet.rl.WakeUp(pb2.WakeUpRequest(), metadata=AUTH)
    assert not fleet.rl.IsSleeping(pb2.IsSleepingRequest(), metadata=AUTH).sleeping
    with pytest.raises(grpc.RpcError) as err:
        fleet.rl.Sleep(pb2.SleepRequest(level=3), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "level" in err.value.details()


def test_weight_update_session_on_sim(fleet: Fleet) -> None:
    before = fleet.rl.GetWeightVersion(pb2.GetWeightVersionRequest(), metadata=AUTH).version
    with pytest.raises(grpc.RpcError) as err:  # no session started
        fleet.rl.UpdateWeights(iter([pb2.Tensor(name="w", dtype="float32", shape=[2], data=bytes(8))]), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    fleet.rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), metadata=AUTH)
    tensors = [pb2.Tensor(name=f"layer.{i}.weight", dtype="float32", shape=[4, 8], data=bytes(128)) for i in range(5)]
    resp = fleet.rl.UpdateWeights(iter(tensors), metadata=AUTH)
    assert (resp.tensors, resp.bytes) == (5, 640)
    with pytest.raises(grpc.RpcError) as err:  # a shape that does not fit its bytes
        fleet.rl.UpdateWeights(iter([pb2.Tensor(name="w", dtype="float32", shape=[3], data=bytes(8))]), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "w" in err.value.details()
    done = fleet.rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version="step-1"), metadata=AUTH)
    assert done.version == "step-1" != before
    assert fleet.rl.GetWeightVersion(pb2.GetWeightVersionRequest(), metadata=AUTH).version == "step-1"


def test_a_tensor_larger_than_a_message_comes_in_pieces(fleet: Fleet) -> None:
    limit = fleet.control.GetServerInfo(pb2.GetServerInfoRequest(), metadata=AUTH).max_message_bytes
    data = bytes(range(256)) * ((2 * limit + 1000) // 256)  # float32 [n]: more than two messages
    pieces = tensor_messages("embed.weight", "float32", [len(data) // 4], data, limit)
    assert len(pieces) == 3 and [p.more for p in pieces] == [True, True, False] and not pieces[1].name
    small = tensor_messages("norm.weight", "float32", [4], bytes(16), limit)
    fleet.rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), metadata=AUTH)
    try:
        resp = fleet.rl.UpdateWeights(iter([*small, *pieces, *small]), metadata=AUTH, timeout=60)
        assert (resp.tensors, resp.bytes) == (3, len(data) + 32)
        refusals = [  # a piece that names another tensor; a stream that ends inside one; more than its shape holds
            ([pieces[0], pb2.Tensor(name="other", data=b"x")], "name: 'other' in a piece of tensor 'embed.weight'"),
            (pieces[:2], "more: the stream ended inside tensor 'embed.weight'"),
            ([pb2.Tensor(name="w", dtype="float32", shape=[2], data=bytes(20), more=True), pb2.Tensor(data=bytes(20))],
             "data: tensor 'w' came with more than the 32 bytes its shape [2] holds")]
        for messages, says in refusals:
            with pytest.raises(grpc.RpcError) as err:
                fleet.rl.UpdateWeights(iter(messages), metadata=AUTH, timeout=60)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.value.details()
    finally:
        fleet.rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version="pieces"), metadata=AUTH)


# ---- KvEvents ----------------------------------------------------------------------------------------


class _Subscriber:
    """KvEvents.Subscribe read on a thread, events collected."""

    def __init__(self, fleet: Fleet, after_seq: int = 0, relay_epoch: str = "") -> None:
        self.events: list[Any] = []
        self.call = fleet.kv.Subscribe(pb2.SubscribeRequest(after_seq=after_seq, relay_epoch=relay_epoch),
                                       metadata=AUTH)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for ev in self.call:
                self.events.append(ev)
        except grpc.RpcError:
            pass

    def stop(self) -> None:
        self.call.cancel()
        self.thread.join(5)

    def stored(self) -> set[int]:
        return {h for e in self.events if e.WhichOneof("event") == "stored" for h in e.stored.block_hashes}


def test_kv_events_snapshot_then_live_then_resume_without_gaps(fleet: Fleet) -> None:
    block = fleet.control.GetModelInfo(pb2.GetModelInfoRequest(), metadata=AUTH).block_size
    prompt = list(range(2000, 2000 + 4 * block + 3))
    sub = _Subscriber(fleet)
    _wait(lambda: len(sub.events) >= 2)  # the snapshot: a cleared per rank at least
    assert all(e.snapshot for e in sub.events)
    assert {e.rank for e in sub.events if e.WhichOneof("event") == "cleared"} == {0, 1}
    fleet.inference.Generate(_req(token_ids=prompt, data_parallel_rank=0, sampling={"max_tokens": 2}),
                             metadata=AUTH, timeout=30)
    want = set(block_hashes(prompt, block))
    _wait(lambda: want <= sub.stored())
    live = [e for e in sub.events if not e.snapshot]
    assert all(e.rank == 0 for e in live if e.WhichOneof("event") == "stored" and want & set(e.stored.block_hashes))
    seqs = [e.seq for e in live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gapless
    last, epoch = live[-1].seq, live[-1].relay_epoch
    sub.stop()
    # Events while nobody listens, then a resubscribe from the last one seen: the next seq, no gap.
    other = list(range(5000, 5000 + 3 * block))
    fleet.inference.Generate(_req(token_ids=other, data_parallel_rank=1, sampling={"max_tokens": 2}),
                             metadata=AUTH, timeout=30)
    again = _Subscriber(fleet, after_seq=last, relay_epoch=epoch)
    _wait(lambda: set(block_hashes(other, block)) <= again.stored())
    assert not any(e.snapshot for e in again.events)
    assert again.events[0].seq == last + 1
    got = [e.seq for e in again.events]
    assert got == list(range(last + 1, last + 1 + len(got)))
    again.stop()
    # A relay epoch it does not know: a snapshot, which holds what the ranks hold now.
    fresh = _Subscriber(fleet, after_seq=last, relay_epoch="another-process")
    _wait(lambda: set(block_hashes(other, block)) <= fresh.stored())
    assert fresh.events[0].snapshot
    fresh.stop()


# ---- auth, health, reflection ------------------------------------------------------------------------


def test_every_service_needs_the_api_key_but_health(fleet: Fleet) -> None:
    calls = [lambda md: fleet.inference.Generate(_req(), metadata=md, timeout=10),
             lambda md: list(fleet.inference.GenerateStream(_req(), metadata=md, timeout=10)),
             lambda md: fleet.control.GetLoads(pb2.GetLoadsRequest(), metadata=md, timeout=10),
             lambda md: fleet.rl.IsPaused(pb2.IsPausedRequest(), metadata=md, timeout=10),
             lambda md: fleet.rl.UpdateWeights(iter([]), metadata=md, timeout=10),
             lambda md: next(iter(fleet.kv.Subscribe(pb2.SubscribeRequest(), metadata=md, timeout=10)))]
    for call in calls:
        for md in ((), (("authorization", "Bearer wrong"),), (("x-api-key", "wrong"),)):
            with pytest.raises(grpc.RpcError) as err:
                call(md)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "API key" in err.value.details()
    assert fleet.control.GetLoads(pb2.GetLoadsRequest(), metadata=(("x-api-key", KEY),)).ranks
    health = health_pb2_grpc.HealthStub(fleet.channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="fleet.v1.Inference")).status == \
        health_pb2.HealthCheckResponse.SERVING
    # HTTP takes the same keys, in the same two forms (edge/api_keys.py: one rule for every face).
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
    assert httpx.post(fleet.frontend.url + "/v1/completions", json=body).status_code == 401
    wrong = httpx.post(fleet.frontend.url + "/v1/completions", json=body, headers={"x-api-key": "wrong"})
    assert wrong.status_code == 401 and "x-api-key" in wrong.json()["error"]["message"]
    for headers in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
        assert httpx.post(fleet.frontend.url + "/v1/completions", json=body, headers=headers).status_code == 200
    assert httpx.get(fleet.frontend.url + "/health").status_code == 200


def test_reflection_lists_every_service(fleet: Fleet) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(fleet.channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                        metadata=AUTH)
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"fleet.v1.Inference", "fleet.v1.Control", "fleet.v1.RlControl", "fleet.v1.KvEvents",
            "grpc.health.v1.Health"} <= names


def test_the_kv_event_stream_survives_an_engine_restart(tmp_path: Path) -> None:
    """One rank restarted under a live subscription: a `cleared` for the old session, then one for the new
    epoch, then the new session's events, on the same stream with no gap in seq."""
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "2")
    grpc_port = free_port_block(1, spread=0)
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--grpc-port", str(grpc_port))
    f = Fleet(engine, fe, grpc_port)  # no --api-key here: no metadata needed
    try:
        block = f.control.GetModelInfo(pb2.GetModelInfoRequest()).block_size
        sub = _Subscriber(f)
        _wait(lambda: len(sub.events) >= 1)
        first = list(range(3000, 3000 + 3 * block))
        f.inference.Generate(_req(token_ids=first), timeout=30)
        _wait(lambda: set(block_hashes(first, block)) <= sub.stored())
        old_epoch = sub.events[-1].epoch
        port = engine.port
        engine.stop()
        engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "2", port=port)
        fe.wait_ready()
        second = list(range(7000, 7000 + 3 * block))
        f.inference.Generate(_req(token_ids=second), timeout=30)
        want = set(block_hashes(second, block))
        _wait(lambda: want <= {h for e in sub.events if e.epoch != old_epoch and e.WhichOneof("event") == "stored"
                               for h in e.stored.block_hashes})
        live = [e for e in sub.events if not e.snapshot]
        assert [e.seq for e in live] == list(range(live[0].seq, live[0].seq + len(live)))  # one stream, no gap
        cleared = [(e.epoch, i) for i, e in enumerate(live) if e.WhichOneof("event") == "cleared"]
        new_epoch = next(e.epoch for e in reversed(live) if e.WhichOneof("event") == "stored")
        assert new_epoch != old_epoch
        assert any(ep == old_epoch for ep, _ in cleared) and any(ep == new_epoch for ep, _ in cleared)
        first_new = next(i for i, e in enumerate(live) if e.epoch == new_epoch)
        assert live[first_new].WhichOneof("event") == "cleared"  # the new session starts empty
        sub.stop()
    finally:
        f.channel.close()
        fe.stop()
        engine.stop()


def test_sigterm_ends_kv_event_streams_so_the_frontend_exits_without_waiting_out_its_grace(tmp_path: Path) -> None:
    """A KvEvents stream never ends by itself: on SIGTERM the frontend ends it (the subscriber sees the
    stream finish and resubscribes elsewhere), so the drain does not wait out --shutdown-timeout. A
    GenerateStream running then is drained: it ends whole, not cut."""
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "2")
    grpc_port = free_port_block(1, spread=0)
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--grpc-port", str(grpc_port), "--shutdown-timeout", "300")
    f = Fleet(engine, fe, grpc_port)
    try:
        sub = _Subscriber(f)
        _wait(lambda: len(sub.events) >= 1)
        stream = f.inference.GenerateStream(_req(sampling={"max_tokens": 400, "ignore_eos": True}), timeout=60)
        got = [next(stream)]
        # Within the 30 s before stop() kills it: a stream left open would hold the exit for 300 s.
        assert fe.stop(timeout_s=30) == 0, fe.log()[-3000:]
        sub.thread.join(10)
        assert not sub.thread.is_alive()
        assert sub.call.code() == grpc.StatusCode.OK  # ended by the server, not broken
        got += list(stream)
        assert sum(len(m.token_ids) for m in got) == 400 and got[-1].finish_reason == "length"
    finally:
        f.channel.close()
        fe.stop()
        engine.stop()


def _hold_http_stream(url: str, prompt: list[int], stop: threading.Event) -> threading.Thread:
    """A streamed HTTP token-in request on its own connection, read until `stop` (then the connection closes
    and the frontend aborts it)."""
    def run() -> None:
        body = {"token_ids": prompt, "stream": True, "sampling_params": {"max_tokens": 3000, "ignore_eos": True}}
        with httpx.Client(timeout=60) as client, client.stream("POST", url + "/inference/v1/generate",
                                                               json=body) as r:
            assert r.status_code == 200, r.read()
            for _ in r.iter_raw():
                if stop.is_set():
                    break
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_with_two_api_servers_loads_and_kv_events_cover_both(tmp_path: Path) -> None:
    """--api-server-count 2: API server 0 alone serves gRPC, each server has its own engine links. GetLoads'
    in_flight counts both servers' requests, KvEvents relays the blocks of requests either served, and
    Control.Abort ends a call made over gRPC (every one is on API server 0)."""
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "5")
    grpc_port = free_port_block(1, spread=0)
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--grpc-port", str(grpc_port), "--api-server-count", "2")
    f = Fleet(engine, fe, grpc_port)
    stop = threading.Event()
    try:
        _wait(lambda: fe.log().count("engine rank(s) ready") >= 2, 60)  # both processes, each with its link
        assert "gRPC is served by API server 0 of 2" in fe.log()
        block = f.control.GetModelInfo(pb2.GetModelInfoRequest()).block_size
        sub = _Subscriber(f)
        # Each stream on a connection of its own: the kernel spreads them over both API servers.
        prompts = [list(range(10_000 + 1000 * i, 10_000 + 1000 * i + 2 * block + 1)) for i in range(8)]
        holders = [_hold_http_stream(fe.url, p, stop) for p in prompts]
        in_flight = lambda: sum(r.in_flight for r in f.control.GetLoads(pb2.GetLoadsRequest()).ranks)  # noqa: E731
        _wait(lambda: in_flight() == len(prompts))
        want = {h for p in prompts for h in block_hashes(p, block)}
        _wait(lambda: want <= sub.stored())
        stop.set()
        for t in holders:
            t.join(30)
        _wait(lambda: in_flight() == 0)
        got: dict[str, Any] = {}

        def generate() -> None:
            got["resp"] = f.inference.Generate(_req(request_id="two-servers", sampling={"max_tokens": 3000,
                                                                                       "ignore_eos": True}),
                                               timeout=60)
        t = threading.Thread(target=generate)
        t.start()
        _wait(lambda: in_flight() == 1)
        assert list(f.control.Abort(pb2.AbortRequest(request_ids=["two-servers"])).aborted) == ["two-servers"]
        t.join(30)
        assert got["resp"].finish_reason == "abort"
        sub.stop()
    finally:
        stop.set()
        f.channel.close()
        fe.stop()
        engine.stop()
