"""The frontend's gRPC port as a client sees it on the wire (one sim rank, a frontend with --grpc-port,
--api-key and a 256 KiB --max-body-bytes): the official client on the native calls (GenerateStream,
Generate, and since it was written UpdateWeights) and on relayed ones (Control, KvEvents), then raw HTTP/2 frames
(tests/support/h2_client.py). Black-box, written against grpc.aio before the port served it: whatever
serves the port must keep these answers."""
from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

import grpc
import h2.events
import h2.settings
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol.block_hash import block_hashes
from protocol.grpc import pb2
from tests.integration.conftest import SIM
from tests.support.grpc_fleet import Fleet, running
from tests.support.h2_client import GRPC_HEADERS, H2Client, Stream, connections, grpc_frame, grpc_messages
from tests.support.waiting import until

KEY = "wire-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
WRONG = (("authorization", "Bearer wrong"),)
LIMIT = 256 * 1024  # --max-body-bytes: small, so a message past it is cheap to send
WINDOW = 65_535  # HTTP/2's default initial window, the raw client's (it never raises it)
PROMPT = list(range(100, 140))
STREAM = "/fleet.v1.Inference/GenerateStream"
GENERATE = "/fleet.v1.Inference/Generate"
UNLOAD_LORA = "/fleet.v1.Control/UnloadLora"
ODD = "50% é\n x"  # non-ASCII, a newline and a percent sign: grpc-message percent-encodes all three


Raw = Callable[..., H2Client]  # the `raw` fixture: a new connection, auto_ack= optional


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running(tmp_path_factory.mktemp("grpc-wire"), [*SIM, "--sim-decode-ms", "1"],
                 ["--api-key", KEY, "--max-body-bytes", str(LIMIT)]) as f:
        yield f


@pytest.fixture
def raw(fleet: Fleet) -> Iterator[Raw]:
    """Raw HTTP/2 connections to the gRPC port, each closed after the test whatever happened."""
    with connections(fleet.grpc_port) as connect:
        yield connect


def _req(**kw: Any) -> Any:
    sampling = kw.pop("sampling", {})
    return pb2.GenerateRequest(token_ids=kw.pop("token_ids", PROMPT),
                               sampling_params=pb2.SamplingParams(**{"max_tokens": 12, "temperature": 0.0,
                                                                     **sampling}), **kw)


LONG = {"max_tokens": 3000, "ignore_eos": True}  # seconds of sim steps: stopped by a pause long before its end


def _http(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(fleet.frontend.url + "/inference/v1/generate", json=body, timeout=30,
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _tokens(messages: Any) -> list[int]:
    return [t for m in messages for t in m.token_ids]


def _loads(fleet: Fleet) -> tuple[int, int]:
    """(the frontend's requests in flight, the engine's running requests)."""
    ranks = fleet.control.GetLoads(pb2.GetLoadsRequest(), metadata=AUTH).ranks
    return sum(r.in_flight for r in ranks), sum(r.running for r in ranks)


def _in_flight(fleet: Fleet, n: int) -> None:
    until(f"{n} request(s) in flight", lambda: True if _loads(fleet)[0] == n else None, 10, 0.02)


def _gone_from_the_engine(fleet: Fleet) -> None:
    until("no request in flight or running", lambda: True if _loads(fleet) == (0, 0) else None, 10, 0.02)


@contextmanager
def _frozen(fleet: Fleet) -> Iterator[None]:
    """Generation paused (KEEP): a running request stays at its engine until something aborts it, so a
    request the server failed to end can never pass for one that finished meanwhile."""
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_KEEP), metadata=AUTH, timeout=10)
    try:
        yield
    finally:
        fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest(), metadata=AUTH, timeout=10)


def _rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# ---- the official client: results -------------------------------------------------------------------


def test_a_stream_equals_the_http_token_in_route(fleet: Fleet) -> None:
    sampling = {"max_tokens": 24, "temperature": 0.8, "seed": 7}
    chunks = list(fleet.inference.GenerateStream(_req(request_id="mine", return_text=True, sampling=sampling),
                                                 metadata=AUTH, timeout=30))
    choice = _http(fleet, {"token_ids": PROMPT, "return_text": True, "sampling_params": sampling})["choices"][0]
    assert len(chunks) > 1 and all(c.request_id == "mine" for c in chunks)
    assert _tokens(chunks) == choice["token_ids"]
    assert "".join(c.text for c in chunks) == choice["text"]
    assert chunks[-1].finish_reason == choice["finish_reason"] == "length"
    assert chunks[-1].usage.completion_tokens == 24


def test_a_unary_call_equals_the_http_token_in_route(fleet: Fleet) -> None:
    sampling = {"max_tokens": 24, "temperature": 0.8, "seed": 8}
    resp = fleet.inference.Generate(_req(return_text=True, sampling=sampling), metadata=AUTH, timeout=30)
    choice = _http(fleet, {"token_ids": PROMPT, "return_text": True, "sampling_params": sampling})["choices"][0]
    assert list(resp.token_ids) == choice["token_ids"] and resp.text == choice["text"]
    info = fleet.control.GetServerInfo(pb2.GetServerInfoRequest(), metadata=AUTH, timeout=10)
    assert info.max_message_bytes == LIMIT and info.ready_ranks == [0]


def test_32_streams_at_once_on_one_channel_each_equal_its_solo_run(fleet: Fleet) -> None:
    reqs = [_req(token_ids=list(range(200 + i, 230 + i)),
                 sampling={"max_tokens": 24, "temperature": 1.0, "seed": i, "ignore_eos": True}) for i in range(32)]
    solo = [_tokens(fleet.inference.GenerateStream(r, metadata=AUTH, timeout=30)) for r in reqs]
    assert len({tuple(s) for s in solo}) == 32  # each its own tokens: a mix-up would show
    calls = [fleet.inference.GenerateStream(r, metadata=AUTH, timeout=30) for r in reqs]  # all open, then read
    assert [_tokens(c) for c in calls] == solo


def test_a_2000_token_stream_crosses_the_flow_control_window_many_times(fleet: Fleet) -> None:
    sampling = {"max_tokens": 2000, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    chunks = list(fleet.inference.GenerateStream(_req(sampling={**sampling, "logprobs": 20}), metadata=AUTH,
                                                 timeout=60))
    assert sum(c.ByteSize() + 5 for c in chunks) > 6 * WINDOW
    want = _http(fleet, {"token_ids": PROMPT, "sampling_params": sampling})["choices"][0]["token_ids"]
    assert _tokens(chunks) == want and len(want) == 2000
    assert sum(len(c.logprobs) for c in chunks) == 2000
    assert chunks[-1].finish_reason == "length"


def test_a_client_stream_crosses_the_window_in_the_request_direction(fleet: Fleet) -> None:
    tensors = [pb2.Tensor(name=f"layer.{i}.weight", dtype="uint8", shape=[200_000], data=bytes([i]) * 200_000)
               for i in range(4)]
    fleet.rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), metadata=AUTH, timeout=10)
    try:
        resp = fleet.rl.UpdateWeights(iter(tensors), metadata=AUTH, timeout=30)
        assert (resp.tensors, resp.bytes) == (4, 800_000)
    finally:
        fleet.rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version="wire"), metadata=AUTH, timeout=10)


def test_a_relayed_server_stream_sends_kv_events_as_they_happen(fleet: Fleet) -> None:
    block = fleet.control.GetModelInfo(pb2.GetModelInfoRequest(), metadata=AUTH).block_size
    call = fleet.kv.Subscribe(pb2.SubscribeRequest(), metadata=AUTH, timeout=30)
    first = next(call)
    assert first.snapshot and first.WhichOneof("event") == "cleared"  # a new subscriber starts from a snapshot
    prompt = list(range(4000, 4000 + 3 * block))
    fleet.inference.Generate(_req(token_ids=prompt, sampling={"max_tokens": 2}), metadata=AUTH, timeout=30)
    want, stored = set(block_hashes(prompt, block)), set()
    for ev in call:  # blocks until the events come: a stream that stalled would hit the call's timeout
        if ev.WhichOneof("event") == "stored":
            stored |= set(ev.stored.block_hashes)
        if want <= stored:
            break
    call.cancel()
    assert want <= stored, "the stream ended before the blocks' events came"


def test_messages_larger_than_one_http2_frame_arrive_whole(fleet: Fleet) -> None:
    """16 KiB is HTTP/2's default largest frame: a bigger message spans DATA frames and must come out whole."""
    chunks = list(fleet.inference.GenerateStream(
        _req(sampling={"max_tokens": 200, "ignore_eos": True, "logprobs": 20, "stream_interval": 100}),
        metadata=AUTH, timeout=30))
    assert max(c.ByteSize() for c in chunks) > 16 * 1024
    assert sum(len(c.token_ids) for c in chunks) == sum(len(c.logprobs) for c in chunks) == 200
    assert all(len(lp.top_logprobs) == 20 for c in chunks for lp in c.logprobs)
    prompt = list(range(300, 500))
    resp = fleet.inference.Generate(_req(token_ids=prompt, sampling={"max_tokens": 2, "prompt_logprobs": 20}),
                                    metadata=AUTH, timeout=30)
    assert resp.ByteSize() > 16 * 1024
    assert [p.token_id for p in resp.prompt_logprobs] == prompt[1:]


def test_a_gzip_compressed_request_is_served_the_same(fleet: Fleet) -> None:
    req = _req(sampling={"max_tokens": 16, "temperature": 1.0, "seed": 11})
    plain = _tokens(fleet.inference.GenerateStream(req, metadata=AUTH, timeout=30))
    gz = grpc.Compression.Gzip
    assert _tokens(fleet.inference.GenerateStream(req, metadata=AUTH, timeout=30, compression=gz)) == plain
    assert list(fleet.inference.Generate(req, metadata=AUTH, timeout=30, compression=gz).token_ids) == plain
    fleet.rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), metadata=AUTH, timeout=10)
    try:  # zeros: each message, just under the limit, is a few hundred bytes on the wire
        tensors = [pb2.Tensor(name=f"t{i}", dtype="uint8", shape=[LIMIT - 1000], data=bytes(LIMIT - 1000))
                   for i in range(2)]
        resp = fleet.rl.UpdateWeights(iter(tensors), metadata=AUTH, timeout=30, compression=gz)
        assert (resp.tensors, resp.bytes) == (2, 2 * (LIMIT - 1000))
    finally:
        fleet.rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version="gzip"), metadata=AUTH, timeout=10)


# ---- the official client: deadlines and cancels -----------------------------------------------------


def test_a_deadline_shorter_than_the_stream_ends_it_at_the_engine(fleet: Fleet) -> None:
    call = fleet.inference.GenerateStream(_req(sampling=LONG), metadata=AUTH, timeout=1.0)
    got = [next(call)]
    with _frozen(fleet):
        err = _rpc_error(lambda: got.extend(call))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        _gone_from_the_engine(fleet)
    assert 0 < len(_tokens(got)) < 3000


def test_a_deadline_ends_a_unary_call_at_the_engine(fleet: Fleet) -> None:
    future = fleet.inference.Generate.future(_req(sampling=LONG), metadata=AUTH, timeout=1.0)
    _in_flight(fleet, 1)
    with _frozen(fleet):
        assert future.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # waits for the end
        _gone_from_the_engine(fleet)


def test_a_deadline_ends_a_relayed_server_stream(fleet: Fleet) -> None:
    call = fleet.kv.Subscribe(pb2.SubscribeRequest(), metadata=AUTH, timeout=0.5)
    err = _rpc_error(lambda: list(call))  # a KV event stream never ends by itself
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_cancelling_a_stream_mid_way_ends_the_engine_request(fleet: Fleet) -> None:
    call = fleet.inference.GenerateStream(_req(sampling=LONG), metadata=AUTH, timeout=30)
    next(call)
    _in_flight(fleet, 1)
    with _frozen(fleet):
        call.cancel()
        _gone_from_the_engine(fleet)
    assert call.code() == grpc.StatusCode.CANCELLED


def test_cancelling_a_unary_call_ends_the_engine_request(fleet: Fleet) -> None:
    future = fleet.inference.Generate.future(_req(sampling=LONG), metadata=AUTH, timeout=30)
    _in_flight(fleet, 1)
    with _frozen(fleet):
        assert future.cancel()
        _gone_from_the_engine(fleet)


# ---- the official client: metadata, limits, status text, methods ------------------------------------


def _calls(fleet: Fleet, req: Any, tensor: Any) -> dict[str, Callable[[Any], Any]]:
    """The stream and a relayed call of each shape, each taking its metadata."""
    return {
        "GenerateStream": lambda md: list(fleet.inference.GenerateStream(req, metadata=md, timeout=10)),
        "Generate": lambda md: fleet.inference.Generate(req, metadata=md, timeout=10),
        "GetServerInfo": lambda md: fleet.control.GetServerInfo(pb2.GetServerInfoRequest(), metadata=md, timeout=10),
        "Subscribe": lambda md: next(fleet.kv.Subscribe(pb2.SubscribeRequest(), metadata=md, timeout=10)),
        "UpdateWeights": lambda md: fleet.rl.UpdateWeights(iter([tensor]), metadata=md, timeout=10),
    }


def test_the_api_key_is_required_on_the_stream_and_relayed_calls_but_not_health(fleet: Fleet) -> None:
    tensor = pb2.Tensor(name="w", dtype="uint8", shape=[4], data=bytes(4))
    for name, call in _calls(fleet, _req(), tensor).items():
        for md in ((), WRONG, (("x-api-key", "wrong"),)):
            err = _rpc_error(lambda: call(md))  # noqa: B023 - called at once
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (name, md, err.details())
            assert "API key" in err.details()
    assert _tokens(fleet.inference.GenerateStream(_req(), metadata=(("x-api-key", KEY),), timeout=10))
    health = health_pb2_grpc.HealthStub(fleet.channel)
    for service in ("", "fleet.v1.Inference"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_a_wrong_key_is_refused_before_an_oversized_message_is_read(fleet: Fleet) -> None:
    big, tensor = _big_messages()
    for name, call in _calls(fleet, big, tensor).items():
        if name in ("GetServerInfo", "Subscribe"):
            continue  # their requests are empty
        err = _rpc_error(lambda: call(WRONG))  # noqa: B023 - called at once
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (name, err.details())


def _big_messages() -> tuple[Any, Any]:
    big = _req(token_ids=[100_000] * (LIMIT // 3))  # 3 bytes a token id: past the limit
    tensor = pb2.Tensor(name="w", dtype="uint8", shape=[LIMIT + 1], data=bytes(LIMIT + 1))
    assert big.ByteSize() > LIMIT and tensor.ByteSize() > LIMIT
    return big, tensor


def test_a_message_past_the_body_limit_is_resource_exhausted(fleet: Fleet) -> None:
    big, tensor = _big_messages()
    for name, call in _calls(fleet, big, tensor).items():
        if name in ("GetServerInfo", "Subscribe"):
            continue
        err = _rpc_error(lambda: call(AUTH))  # noqa: B023 - called at once
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, err.details())
        assert f"vs. {LIMIT})" in err.details()
    # Under the limit on the wire, past it once inflated: the limit is on the message, not its gzip.
    assert len(gzip.compress(big.SerializeToString())) < LIMIT // 100
    err = _rpc_error(lambda: next(fleet.inference.GenerateStream(big, metadata=AUTH, timeout=10,
                                                                 compression=grpc.Compression.Gzip)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    err = _rpc_error(lambda: fleet.inference.Generate(big, metadata=AUTH, timeout=10,
                                                      compression=grpc.Compression.Gzip))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    _gone_from_the_engine(fleet)


def test_status_messages_keep_non_ascii_text_percent_signs_and_newlines(fleet: Fleet) -> None:
    """The stream's error quotes the LoRA name with repr() (the newline comes back as the two characters
    backslash-n); Control.UnloadLora's quotes it as sent, a real newline: both survive the wire."""
    err = _rpc_error(lambda: list(fleet.inference.GenerateStream(_req(lora_name=ODD), metadata=AUTH, timeout=10)))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "lora_name '50% é\\n x': no such LoRA adapter" in err.details()
    err = _rpc_error(lambda: fleet.inference.Generate(_req(lora_name=ODD), metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "'50% é\\n x'" in err.details()
    err = _rpc_error(lambda: fleet.control.UnloadLora(pb2.UnloadLoraRequest(name=ODD), metadata=AUTH, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "'50% é\n x' cannot be found" in err.details()


def test_an_unknown_method_is_unimplemented(fleet: Fleet) -> None:
    """With the API key. Without one the answer is UNAUTHENTICATED even for a method that does not exist:
    today's server checks the key before it looks the method up."""
    for path in ("/fleet.v1.Inference/Nope", "/no.Such/Method"):
        unary = fleet.channel.unary_unary(path)
        err = _rpc_error(lambda: unary(b"\x08\x01", metadata=AUTH, timeout=10))  # noqa: B023 - called at once
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err.details()
        stream = fleet.channel.unary_stream(path)
        err = _rpc_error(lambda: list(stream(b"", metadata=AUTH, timeout=10)))  # noqa: B023 - called at once
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err.details()
        err = _rpc_error(lambda: unary(b"", metadata=WRONG, timeout=10))  # noqa: B023 - called at once
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED


# ---- raw HTTP/2 -------------------------------------------------------------------------------------


def _raw_call(client: H2Client, path: str, message: Any, *, headers: Any = (*GRPC_HEADERS, *AUTH)) -> Stream:
    sid = client.request(path, grpc_frame(message.SerializeToString()), headers=headers)
    client.wait(f"{path} answered", lambda: client.streams[sid].closed)
    return client.streams[sid]


def _responses(stream: Stream) -> list[Any]:
    out = []
    for flag, payload in grpc_messages(bytes(stream.data)):
        assert flag == 0  # the server compresses nothing unless asked
        out.append(pb2.GenerateResponse.FromString(payload))
    return out


def test_raw_a_stream_is_headers_then_data_of_whole_messages_then_trailers(fleet: Fleet, raw: Raw) -> None:
    """Small messages: every DATA frame holds whole length-prefixed messages (today one a frame)."""
    client = raw()
    s = _raw_call(client, STREAM, _req(sampling={"max_tokens": 20}))
    assert s.headers is not None and s.headers[":status"] == "200"
    assert s.headers["content-type"].startswith("application/grpc")
    assert "grpc-status" not in s.headers
    assert s.frames[0] == "headers" and s.frames[-1] == "trailers" and set(s.frames[1:-1]) == {"data"}
    assert s.trailers is not None and s.trailers["grpc-status"] == "0" and s.ended
    at = 0
    for size in s.data_frames:
        assert grpc_messages(bytes(s.data[at:at + size]))  # whole messages, none cut at a frame's end
        at += size
    got = _responses(s)
    assert _tokens(got) == _tokens(fleet.inference.GenerateStream(_req(sampling={"max_tokens": 20}),
                                                                  metadata=AUTH, timeout=10))
    assert got[-1].finish_reason == "length"
    unary = _raw_call(client, GENERATE, _req(sampling={"max_tokens": 20}))  # unary: the same shape, one message
    assert unary.frames[0] == "headers" and unary.frames[-1] == "trailers" and unary.trailers == s.trailers
    assert len(_responses(unary)) == 1 and _tokens(_responses(unary)) == _tokens(got)


def test_raw_an_error_before_any_message_is_trailers_only_and_percent_encoded(fleet: Fleet, raw: Raw) -> None:
    """grpc-message is percent-encoded UTF-8: "%" itself, non-ASCII bytes and control characters encoded
    (how printable ASCII is written is the encoder's choice, so the text is compared decoded)."""
    client = raw()
    for path, message, code, text, encoded in (
            (STREAM, _req(sampling={"temperature": -1.0}), "3", "sampling_params.temperature=-1.0 is out of range",
             ()),
            (STREAM, _req(lora_name=ODD), "5", "lora_name '50% é\\n x'", ("%25", "%C3%A9")),
            (GENERATE, _req(lora_name=ODD), "5", "lora_name '50% é\\n x'", ("%25", "%C3%A9")),
            (UNLOAD_LORA, pb2.UnloadLoraRequest(name=ODD), "5", "'50% é\n x' cannot be found",
             ("%25", "%C3%A9", "%0A"))):
        s = _raw_call(client, path, message)
        assert s.frames == ["headers+end"], (path, s.frames)  # one HEADERS frame, END_STREAM set
        assert s.headers is not None and s.headers[":status"] == "200"
        assert s.headers["content-type"].startswith("application/grpc")
        wire = s.headers["grpc-message"]
        assert s.headers["grpc-status"] == code and text in unquote(wire), (path, s.headers)
        assert wire.isascii() and "\n" not in wire and all(e in wire for e in encoded), wire


def test_raw_auth_and_size_refusals_come_before_the_message_is_sent(fleet: Fleet, raw: Raw) -> None:
    """The request stream is left open with no message (or only a prefix announcing a message past the
    limit): the answer comes anyway, trailers-only, then RST_STREAM(NO_ERROR) to close our half."""
    client = raw()
    too_big = struct.pack(">BI", 0, LIMIT + 1)
    for path, headers, body, code in ((STREAM, WRONG, None, "16"), (GENERATE, WRONG, None, "16"),
                                      (STREAM, WRONG, too_big, "16"), (GENERATE, WRONG, too_big, "16"),
                                      (STREAM, AUTH, too_big, "8"), (GENERATE, AUTH, too_big, "8")):
        sid = client.request(path, body, headers=(*GRPC_HEADERS, *headers), end=False)
        s = client.streams[sid]
        client.wait(f"{path} refused", lambda: s.closed)  # noqa: B023 - called at once
        assert s.frames[0] == "headers+end" and s.status["grpc-status"] == code, (path, s.frames, s.status)
        assert s.reset_code in (None, 0)


def test_raw_content_type_and_te_checks(fleet: Fleet, raw: Raw) -> None:
    """What today's server (grpc core) does, surprising in part: a content-type that is not gRPC's, or none,
    is served as gRPC all the same (the gRPC HTTP/2 spec suggests 415); a request without `te: trailers`
    is refused with RST_STREAM(INTERNAL_ERROR) and no response at all."""
    client = raw()
    for content_type in ("text/plain", None, "application/grpc+proto"):
        headers = (*([("content-type", content_type)] if content_type else []), ("te", "trailers"), *AUTH)
        s = _raw_call(client, GENERATE, _req(sampling={"max_tokens": 3}), headers=headers)
        assert s.headers is not None and s.headers[":status"] == "200", (content_type, s.frames)
        assert s.status["grpc-status"] == "0" and len(_tokens(_responses(s))) == 3
    s = _raw_call(client, GENERATE, _req(), headers=(("content-type", "application/grpc"), *AUTH))
    assert s.frames == ["reset"] and s.reset_code == 2


def test_raw_a_compressed_message_needs_its_encoding_header(fleet: Fleet, raw: Raw) -> None:
    client = raw()
    message = _req(sampling={"max_tokens": 8}).SerializeToString()
    sid = client.request(STREAM, grpc_frame(gzip.compress(message), compressed=True),
                         headers=(*GRPC_HEADERS, ("grpc-encoding", "gzip"), *AUTH))
    client.wait("gzip answered", lambda: client.streams[sid].closed)
    s = client.streams[sid]
    assert s.status["grpc-status"] == "0" and len(_tokens(_responses(s))) == 8
    sid = client.request(STREAM, grpc_frame(gzip.compress(message), compressed=True), headers=(*GRPC_HEADERS, *AUTH))
    client.wait("refused", lambda: client.streams[sid].closed)
    s = client.streams[sid]
    assert s.frames == ["headers+end"] and s.status["grpc-status"] == "13"  # INTERNAL: no encoding to undo it


@pytest.mark.parametrize("leave", ["rst_stream", "close", "goaway_then_close"])
def test_raw_a_client_leaving_mid_stream_ends_the_engine_request(fleet: Fleet, raw: Raw, leave: str) -> None:
    """RST_STREAM(CANCEL), the socket closed, or GOAWAY then the close (what a client that shuts down sends)."""
    client = raw()
    sid = client.request(STREAM, grpc_frame(_req(sampling=LONG).SerializeToString()), headers=(*GRPC_HEADERS, *AUTH))
    client.wait("first message", lambda: len(client.streams[sid].data) > 0)
    _in_flight(fleet, 1)
    with _frozen(fleet):
        if leave == "rst_stream":
            client.reset(sid)
        if leave == "goaway_then_close":
            client.goaway()
        if leave in ("close", "goaway_then_close"):
            client.close()
        _gone_from_the_engine(fleet)


def test_raw_a_goaway_from_the_client_alone_lets_its_streams_finish(fleet: Fleet, raw: Raw) -> None:
    """A client's GOAWAY only refuses streams the server would start (RFC 9113 6.8): the streams the client
    opened run to their end, every token sent, on the same connection."""
    client = raw()
    sid = client.request(STREAM, grpc_frame(_req(sampling={"max_tokens": 300, "ignore_eos": True})
                                            .SerializeToString()), headers=(*GRPC_HEADERS, *AUTH))
    s = client.streams[sid]
    client.wait("first message", lambda: len(s.data) > 0)
    client.send_goaway_frame()
    client.wait("the stream ended", lambda: s.closed)
    assert s.status["grpc-status"] == "0" and len(_tokens(_responses(s))) == 300


def test_raw_a_reader_that_stops_reading_stalls_only_its_own_stream(fleet: Fleet, raw: Raw) -> None:
    """No WINDOW_UPDATE from the client: the server sends up to the 64 KiB window (today all of it) and
    waits, other connections keep flowing, and once the client grants the window back the stream ends with
    every token."""
    client = raw(auto_ack=False)
    n = 1000  # ~270 KB with 20 logprobs a token: four windows
    sid = client.request(STREAM, grpc_frame(_req(sampling={"max_tokens": n, "ignore_eos": True, "logprobs": 20})
                                            .SerializeToString()), headers=(*GRPC_HEADERS, *AUTH))
    s = client.streams[sid]
    client.wait("the window filled", lambda: len(s.data) >= WINDOW - 16 * 1024)  # a frame's worth of slack
    other = list(fleet.inference.GenerateStream(_req(sampling={"max_tokens": 50}), metadata=AUTH, timeout=10))
    assert len(_tokens(other)) == 50
    client.pump(0.2)  # nothing more may come: the window is shut (h2 would raise past it)
    assert len(s.data) <= WINDOW and not s.closed
    client.auto_ack = True
    client.ack(sid)
    client.wait("the stream ended", lambda: s.closed, 30)
    assert s.status["grpc-status"] == "0"
    got = _responses(s)
    assert len(_tokens(got)) == n and got[-1].finish_reason == "length"
    _gone_from_the_engine(fleet)


def test_raw_ping_is_answered_with_its_payload(fleet: Fleet, raw: Raw) -> None:
    client = raw()
    client.ping(b"wire-ok!")
    client.wait("PING ack", lambda: any(isinstance(e, h2.events.PingAckReceived) for e in client.events))
    acks = [e for e in client.events if isinstance(e, h2.events.PingAckReceived)]
    assert [a.ping_data for a in acks] == [b"wire-ok!"]


def test_raw_settings_are_exchanged_acknowledged_and_obeyed(fleet: Fleet, raw: Raw) -> None:
    """The server's SETTINGS come first (h2 acknowledges them), the server acknowledges ours, and a window
    we shrink by a later SETTINGS is the most it sends on a stream before a WINDOW_UPDATE."""
    client = raw(auto_ack=False)
    acked = lambda: sum(isinstance(e, h2.events.SettingsAcknowledged) for e in client.events)  # noqa: E731
    client.wait("our SETTINGS acknowledged", lambda: acked() >= 1)
    assert isinstance(client.events[0], h2.events.RemoteSettingsChanged)
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4096})
    client.wait("the new SETTINGS acknowledged", lambda: acked() >= 2)
    sid = client.request(STREAM, grpc_frame(_req(sampling={"max_tokens": 100, "ignore_eos": True, "logprobs": 5})
                                            .SerializeToString()), headers=(*GRPC_HEADERS, *AUTH))
    s = client.streams[sid]
    client.wait("the small window filled", lambda: len(s.data) >= 3072)  # ~70-byte messages: some slack
    client.pump(0.2)
    assert len(s.data) <= 4096 and not s.closed
    client.auto_ack = True
    client.ack(sid)
    client.wait("the stream ended", lambda: s.closed)
    assert s.status["grpc-status"] == "0" and len(_tokens(_responses(s))) == 100
