"""A stream's events written in the dispatch pass (http_api/direct_stream.py), against uvicorn's own
RequestResponseCycle over a recording transport: the same bytes as the ASGI path, tokens between the
first and the last never through the ASGI send, and a paused transport, a failure, a stop string and a
client that left handed back to the response task."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from protocol import GenerateRequest, PackedLogprobs, RequestOutput, SamplingParams
from protocol.logprobs import pack
from services.frontend.engine_client import engines
from services.frontend.engine_client.inflight import CLIENT_GONE, InFlight, end_of_pass
from services.frontend.generation import direct_stream, output
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.output import OutputProcessor
from services.frontend.http_api.response_writer import send_stream, send_tokens
from services.frontend.model import Model
from services.frontend.requests.engine_request import EngineRequest, OutputOptions

HELLO, WORLD, COMMA = 9707, 1879, 11  # "Hello", " world", ","


class _Transport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0
        self.buffered = 0  # bytes the kernel did not take (uvloop's write buffer)
        self.broken = 0  # writes to fail (a bug under the outlet)
        self.on_write: Callable[[], None] | None = None  # called at each write

    def write(self, data: bytes) -> None:
        if self.on_write is not None:
            self.on_write()
        if self.broken:
            self.broken -= 1
            raise RuntimeError("a bug under the outlet")
        self.data += data
        self.writes += 1

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


class _Engines:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, stream: InFlight) -> None:
        self.aborted.append(stream.request_id)

    def place_again(self, stream: InFlight, request: EngineRequest, exclude: set[int]) -> bool:
        return False


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


@pytest.fixture(autouse=True, params=["c", "python"])
def step(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with the plain steps, the dispatch loop and the pass's writes in C (generation/_plainc.c,
    engine_client/_dispatch.c) and in Python (their fallback)."""
    if request.param == "python":
        monkeypatch.setattr(output, "PlainStep", None)
        monkeypatch.setattr(engines, "dispatch", None)
        monkeypatch.setattr(direct_stream, "write_pass", None)
        monkeypatch.setattr(direct_stream, "PlainStep", None)
    elif output.PlainStep is None:
        pytest.skip("the C plain step is not built here (test_plainc.py says whether it should be)")
    return str(request.param)


def _pause(cycle: RequestResponseCycle) -> None:
    """The client stopped reading: the kernel's buffer is full, the transport holds bytes back, and past its
    high-water mark it pauses the protocol."""
    cycle.transport.buffered = 1 << 20  # type: ignore[attr-defined]
    cycle.flow.pause_writing()


def _resume(cycle: RequestResponseCycle) -> None:
    cycle.transport.buffered = 0  # type: ignore[attr-defined]
    cycle.flow.resume_writing()


def _cycle() -> tuple[RequestResponseCycle, _Transport]:
    transport = _Transport()
    log = logging.getLogger("test")
    cycle = RequestResponseCycle({"type": "http", "method": "POST", "path": "/v1/chat/completions",  # type: ignore[typeddict-item]
                                  "http_version": "1.1", "headers": []},
                                 transport, FlowControl(transport), log, log, False, [],  # type: ignore[arg-type]
                                 asyncio.Event(), False, True, lambda: None)
    return cycle, transport


def _outputs(model: Model, stop: tuple[str, ...] = ()) -> tuple[OutputProcessor, InFlight, _Engines, Metrics]:
    request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=8), time.time()), 8,
                            OutputOptions(chat=True, stream=True, include_usage=True, continuous_usage=False,
                                          stop=stop, include_stop_str_in_output=False, skip_special_tokens=True,
                                          tool_choice="none", response_id="chatcmpl-1"))
    stream = InFlight("r1", 3, 8)
    engines, metrics = _Engines(), Metrics("tiny")
    return (OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=engines, metrics=metrics),
            stream, engines, metrics)


def _body(raw: bytes) -> tuple[bytes, bool]:
    """The chunked body after the head, and whether its last chunk came."""
    rest = raw.split(b"\r\n\r\n", 1)[1]
    body = b""
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n"
            return body, True
        body, rest = body + rest[:size], rest[size + 2:]
    return body, False


def _events(body: bytes) -> list[str]:
    return [e.split(b'"created":', 1)[0].decode() + e.split(b'"model":', 1)[-1].decode()
            for e in body.split(b"\n\n") if e]


def _feed(stream: InFlight, *outs: RequestOutput) -> None:
    """One dispatch pass that carries these outputs, each offered to the stream's plain step first, as
    EngineSet._on_outputs does (test_the_dispatch_pass_gives_plain_steps_to_the_sink runs that)."""
    for out in outs:
        _offer(stream, out)
    end_of_pass()


def _offer(stream: InFlight, out: RequestOutput, frames: list[bytes] | tuple[()] = ()) -> None:
    """One output of a dispatch pass, with its message's raw frames, as EngineSet._on_outputs hands it."""
    plain = stream.plain
    if plain is None or not plain(out, frames, time.monotonic()):
        stream.feed(out, frames)


async def _attached(stream: InFlight) -> None:
    for _ in range(100):  # yields to the response task, no wall-clock wait
        if stream.sink is not None:
            return
        await asyncio.sleep(0)
    raise AssertionError("the direct stream never attached")


async def _under_way(model: Model) -> tuple[InFlight, RequestResponseCycle, _Transport, asyncio.Future[None]]:
    """A chat stream's response task, its first token sent and its direct stream attached."""
    outputs, stream, _, _ = _outputs(model)
    cycle, transport = _cycle()
    task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
    _feed(stream, RequestOutput("r1", [HELLO], None))
    await _attached(stream)
    return stream, cycle, transport, task


class _CountingSend:
    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle, self.bodies = cycle, 0

    async def __call__(self, message: Any) -> None:
        self.bodies += message["type"] == "http.response.body"
        await self.cycle.send(message)


async def _serve(model: Model, outs: list[RequestOutput], *, direct: bool) -> tuple[bytes, bool, int]:
    outputs, stream, _, _ = _outputs(model)
    cycle, transport = _cycle()
    send = _CountingSend(cycle)
    task = asyncio.ensure_future(send_stream(send, [[outputs]], "tiny", None, cycle if direct else None))
    await _play(stream, outs, direct=direct)
    await task
    body, complete = _body(bytes(transport.data))
    return body, complete, send.bodies


async def _play(stream: InFlight, outs: list[RequestOutput], *, direct: bool) -> None:
    """Each output in a pass of its own, the response task let run between them (attached again, when direct)."""
    for out in outs:
        _feed(stream, out)
        await _settle(stream, out, direct=direct)


async def _settle(stream: InFlight, out: RequestOutput, *, direct: bool) -> None:
    """The response task let run after a pass that carried `out` (the direct stream attached again, when direct
    and not finished)."""
    if direct and out.finish_reason is None:
        await _attached(stream)
    else:
        for _ in range(5):
            await asyncio.sleep(0)


def _with_logprobs(model: Model, *, chat: bool, tokens: int) -> tuple[OutputProcessor, InFlight]:
    """A stream's processor with top-2 logprobs."""
    request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=tokens), time.time()), tokens,
                            OutputOptions(chat=chat, stream=True, include_usage=True, continuous_usage=False,
                                          stop=(), include_stop_str_in_output=False, skip_special_tokens=True,
                                          tool_choice="none", response_id="chatcmpl-1", logprobs=2))
    stream = InFlight("r1", 3, tokens)
    outputs = OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=_Engines(), metrics=Metrics("tiny"))
    return outputs, stream


def test_the_bytes_are_the_asgi_paths_and_the_middle_tokens_skip_the_send(model: Model) -> None:
    outs = [RequestOutput("r1", [HELLO], None), RequestOutput("r1", [WORLD], None),
            RequestOutput("r1", [COMMA], None), RequestOutput("r1", [HELLO], "length")]
    direct, complete, sends = asyncio.run(_serve(model, outs, direct=True))
    asgi, asgi_complete, asgi_sends = asyncio.run(_serve(model, outs, direct=False))
    assert complete and asgi_complete
    assert _events(direct) == _events(asgi)
    assert asgi_sends == 4
    assert sends == 2  # the first token (with the head) and the end; " world" and "," went out directly
    assert b'"content":" world"' in direct and direct.endswith(b"data: [DONE]\n\n")


def test_steps_queued_together_go_out_in_one_write_without_process(model: Model,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that carries several steps of a stream (the loop ran late) writes their events in one
    write, with the ASGI path's bytes, and takes the short path: only the first and last go through
    process()."""
    split = model.tokenizer.encode("𓀀", add_special_tokens=False).ids
    passes = [[RequestOutput("r1", [HELLO], None)],
              [RequestOutput("r1", [WORLD], None), *(RequestOutput("r1", [tid], None) for tid in split),
               RequestOutput("r1", [COMMA], None)],
              [RequestOutput("r1", [HELLO], "length")]]
    processed: list[int] = []
    process = OutputProcessor.process
    monkeypatch.setattr(OutputProcessor, "process",
                        lambda self, outs: processed.append(len(outs)) or process(self, outs))

    async def run(direct: bool) -> tuple[bytes, int]:
        outputs, stream, _, _ = _outputs(model)
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle if direct else None))
        writes = 0
        for outs in passes:
            before = transport.writes
            _feed(stream, *outs)
            writes = transport.writes - before if len(outs) > 1 else writes
            if direct and outs[-1].finish_reason is None:
                await _attached(stream)
            else:
                for _ in range(5):
                    await asyncio.sleep(0)
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body, writes

    direct, writes = asyncio.run(run(True))
    assert processed == [1, 1] and writes == 1  # the middle pass: short path, one write in the pass
    asgi, _ = asyncio.run(run(False))
    assert _events(direct) == _events(asgi)
    contents = [json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"].get("content")
                for e in direct.split(b"\n\n") if e.startswith(b"data: {") and b'"content"' in e]
    assert contents == ["", "Hello", " world", "𓀀", ",", "Hello"]  # one event a step with text


@pytest.mark.parametrize("stop", [(), ("xyz",)], ids=["plain", "stop-strings"])
def test_a_paused_transport_hands_the_stream_back_until_it_drains(model: Model, stop: tuple[str, ...]) -> None:
    async def run() -> tuple[bytes, bool, int, int]:
        outputs, stream, _, _ = _outputs(model, stop)
        cycle, transport = _cycle()
        send = _CountingSend(cycle)
        task = asyncio.ensure_future(send_stream(send, [[outputs]], "tiny", None, cycle))
        _feed(stream, RequestOutput("r1", [HELLO], None))
        await _attached(stream)
        _pause(cycle)
        written = transport.writes
        _feed(stream, RequestOutput("r1", [WORLD], None))  # taken, not written: handed to the task
        assert stream.sink is None and transport.writes == written
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.writes == written  # the task's send waits for the transport
        _feed(stream, RequestOutput("r1", [COMMA], None))
        _resume(cycle)
        await _attached(stream)
        _feed(stream, RequestOutput("r1", [HELLO], "length"))
        await task
        body, complete = _body(bytes(transport.data))
        return body, complete, send.bodies, written

    body, complete, sends, _ = asyncio.run(run())
    assert complete
    contents = [e for e in _events(body) if '"content":' in e]
    assert [c.split('"content":', 1)[1].split('}', 1)[0] for c in contents] == ['""', '"Hello"', '" world"', '","',
                                                                                   '"Hello"']
    assert sends == 4  # head + first token, the held " world", ",", and the end


def test_a_transport_holding_bytes_back_below_its_high_water_mark_still_takes_the_chunks(model: Model) -> None:
    """Not paused, only not empty: the checks the C write pass skips for an empty transport are made, and
    they let the chunk through."""
    async def run() -> tuple[int, bool]:
        stream, cycle, transport, task = await _under_way(model)
        transport.buffered = 100
        before = transport.writes
        _offer(stream, RequestOutput("r1", [WORLD], None))
        end_of_pass()
        written = transport.writes - before
        attached = stream.sink is not None
        _feed(stream, RequestOutput("r1", [COMMA], "length"))
        await task
        return written, attached

    assert asyncio.run(run()) == (1, True)


def test_a_write_that_raises_hands_the_body_to_the_response_task(model: Model,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A bug under the outlet (the transport's write raised, once): logged, and the stream's body of the pass
    goes out through its response task instead; nothing lost, nothing twice."""
    async def run() -> bytes:
        stream, cycle, transport, task = await _under_way(model)
        transport.broken = 1
        _offer(stream, RequestOutput("r1", [WORLD], None))
        end_of_pass()
        assert stream.sink is None  # let go: the task sends the body
        _feed(stream, RequestOutput("r1", [COMMA], "length"))
        await task
        return bytes(transport.data)

    with caplog.at_level(logging.ERROR):
        data = asyncio.run(run())
    assert "writing a streamed body failed for r1" in caplog.text and "a bug under the outlet" in caplog.text
    body, complete = _body(data)
    assert complete
    contents = [e.split('"content":', 1)[1].split('}', 1)[0] for e in _events(body) if '"content":' in e]
    assert contents == ['""', '"Hello"', '" world"', '","']


@pytest.mark.parametrize("how", ["output", "fail"])
def test_a_failure_mid_stream_ends_with_an_error_event(model: Model, how: str) -> None:
    """The failure comes as the engine's error output, or as InFlight.fail (the rank's link lost: what
    EngineSet._fail_all calls) while the stream's plain step is on: it is turned off, and the task ends
    the response."""
    async def run() -> bytes:
        stream, _, transport, task = await _under_way(model)
        _feed(stream, RequestOutput("r1", [WORLD], None))
        if how == "output":
            _feed(stream, RequestOutput("r1", [], "error", error="engine rank 0 died"))
        else:
            assert stream.plain is not None
            stream.fail("engine rank 0 died")
            assert stream.plain is None and stream.sink is None
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body

    body = asyncio.run(run())
    assert b'" world"' in body and b"engine rank 0 died" in body and body.endswith(b"data: [DONE]\n\n")


def test_a_stop_string_matched_in_the_dispatch_pass_finishes_the_stream(model: Model) -> None:
    async def run() -> tuple[bytes, list[str]]:
        outputs, stream, engines, _ = _outputs(model, stop=(",",))
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
        _feed(stream, RequestOutput("r1", [HELLO], None))
        await _attached(stream)
        _feed(stream, RequestOutput("r1", [WORLD], None))
        _feed(stream, RequestOutput("r1", [COMMA, HELLO], None))
        assert stream.sink is None  # let go at the match
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body, engines.aborted

    body, aborted = asyncio.run(run())
    assert aborted == ["r1"]
    assert b'"finish_reason":"stop"' in body and b'"stop_reason":","' not in body.split(b"[DONE]")[1]
    assert b'"usage":{' in body and body.endswith(b"data: [DONE]\n\n")


def test_a_client_that_left_ends_the_stream_as_an_abort(model: Model) -> None:
    async def run() -> Metrics:
        outputs, stream, _, metrics = _outputs(model)
        cycle, _ = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
        _feed(stream, RequestOutput("r1", [HELLO], None))
        await _attached(stream)
        cycle.disconnected = True
        stream.fail(CLIENT_GONE)
        await task
        return metrics

    metrics = asyncio.run(run())
    assert metrics.registry.get_sample_value("vllm:request_success_total",
                                             {"model_name": "tiny", "finished_reason": "abort"}) == 1


def test_the_outputs_of_one_pass_go_out_in_one_write(model: Model) -> None:
    async def run() -> tuple[bytes, int, int]:
        outputs, stream, _, _ = _outputs(model)
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
        _feed(stream, RequestOutput("r1", [HELLO], None))
        await _attached(stream)
        before = transport.writes
        _feed(stream, RequestOutput("r1", [WORLD], None), RequestOutput("r1", [COMMA], None),
              RequestOutput("r1", [HELLO], None))  # an engine running ahead of this process
        during = transport.writes - before
        _feed(stream, RequestOutput("r1", [WORLD], "length"))
        await task
        return bytes(transport.data), during, stream.generated

    data, writes, generated = asyncio.run(run())
    assert writes == 1 and generated == 5
    assert b'"content":" world"' in data and b'"content":","' in data and data.count(b'"content":"Hello"') == 2


def test_a_pass_writes_after_every_stream_in_it_is_processed_and_a_write_that_raises_spares_the_rest(
        model: Model) -> None:
    """Two phases a pass: each stream's body made, then the bodies written in the order made. A stream
    whose write raised keeps its body for its response task (whose own send then fails it); the stream
    after it is written in the same pass."""
    async def run() -> tuple[list[list[int]], bytes, bytes, bytes]:
        procs = [_outputs(model) for _ in range(3)]
        for i, (_, stream, _, _) in enumerate(procs):
            stream.request_id = f"r{i}"
        cycles = [_cycle() for _ in procs]
        tasks = [asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
                 for (outputs, _, _, _), (cycle, _) in zip(procs, cycles, strict=True)]
        for _, stream, _, _ in procs:
            _feed(stream, RequestOutput(stream.request_id, [HELLO], None))
        for _, stream, _, _ in procs:
            await _attached(stream)
        pending_at_write: list[list[int]] = []  # at each write: how many outputs each stream still holds
        for _, transport in cycles:
            transport.on_write = lambda: pending_at_write.append([len(stream.pending) for _, stream, _, _ in procs])
        cycles[1][1].broken = 1
        for _, stream, _, _ in procs:
            stream.feed(RequestOutput(stream.request_id, [WORLD], None))
        end_of_pass()
        for _, stream, _, _ in procs:
            if stream.sink is not None:
                _feed(stream, RequestOutput(stream.request_id, [COMMA], "length"))
            else:  # the stream let go: its task owns it, and takes the rest from its queue
                stream.feed(RequestOutput(stream.request_id, [COMMA], "length"))
        await asyncio.gather(*tasks, return_exceptions=True)
        return pending_at_write, *[bytes(transport.data) for _, transport in cycles]

    pending_at_write, data_0, data_1, data_2 = asyncio.run(run())
    assert pending_at_write[:2] == [[0, 0, 0], [0, 0, 0]]  # both writes after all three took their output
    assert b'"content":" world"' in data_0 and b'"content":" world"' in data_2
    assert b'"finish_reason":"length"' in data_0 and b'"finish_reason":"length"' in data_2
    assert b'"content":" world"' in data_1 and b'"finish_reason":"length"' in data_1  # sent by its task


@pytest.mark.parametrize("where", ["queued", "plain step"])
def test_a_bug_in_one_stream_s_processing_fails_that_stream_only(model: Model, monkeypatch: pytest.MonkeyPatch,
                                                                 where: str, step: str) -> None:
    """A bug in one stream's processing, at the pass's end (an output queued) or in its plain step (as
    the dispatch pass reaches it), fails that stream; the other stream of the pass is served."""
    async def run() -> tuple[bytes, bytes]:
        a, stream_a, _, _ = _outputs(model)
        b, stream_b, _, _ = _outputs(model)
        stream_b.request_id = "r2"
        cycle_a, transport_a = _cycle()
        cycle_b, transport_b = _cycle()
        tasks = [asyncio.ensure_future(send_stream(cycle_a.send, [[a]], "tiny", None, cycle_a)),
                 asyncio.ensure_future(send_stream(cycle_b.send, [[b]], "tiny", None, cycle_b))]
        _feed(stream_a, RequestOutput("r1", [HELLO], None))
        _feed(stream_b, RequestOutput("r1", [HELLO], None))
        await _attached(stream_a)
        await _attached(stream_b)

        class Broken:
            byte_stream = a._detok.byte_stream

            def push(self, ids: list[int]) -> str:
                raise ValueError("a bug")

            def push_one(self, tid: int) -> str:
                raise ValueError("a bug")

        monkeypatch.setattr(a, "_detok", Broken())
        if step == "c":  # the C step (armed, with the state lent) fails on a histogram not its shape
            a._metrics.itl.counts.append(0)
        give = stream_a.feed if where == "queued" else (lambda out: _offer(stream_a, out))
        give(RequestOutput("r1", [WORLD], None))
        _offer(stream_b, RequestOutput("r1", [WORLD], None))
        end_of_pass()
        _feed(stream_b, RequestOutput("r1", [COMMA], "length"))
        await asyncio.gather(*tasks)
        return bytes(transport_a.data), bytes(transport_b.data)

    data_a, data_b = asyncio.run(run())
    bug = (b"RuntimeError: the histogram's counts list changed size" if step == "c" and where == "plain step"
           else b"ValueError: a bug")
    assert b"output processing failed: " + bug in data_a and data_a.endswith(b"0\r\n\r\n")
    assert b'"content":" world"' in data_b and b'"finish_reason":"length"' in data_b


@pytest.mark.parametrize("text_out", [False, True], ids=["ids", "ids-and-text"])
def test_a_token_out_stream_is_written_from_the_pass_with_the_asgi_path_s_bytes(model: Model, text_out: bool) -> None:
    async def run(direct: bool) -> tuple[bytes, int]:
        request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=8), time.time()), 8,
                                OutputOptions(chat=False, stream=True, include_usage=True, continuous_usage=False,
                                              stop=(), include_stop_str_in_output=False, skip_special_tokens=True,
                                              tool_choice="none", response_id="gen-1", token_out=True,
                                              text_out=text_out))
        stream = InFlight("r1", 3, 8)
        outputs = OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=_Engines(),
                                  metrics=Metrics("tiny"))
        cycle, transport = _cycle()
        send = _CountingSend(cycle)
        task = asyncio.ensure_future(send_tokens(send, outputs, "tiny", cycle if direct else None))
        await _play(stream, [RequestOutput("r1", [HELLO], None), RequestOutput("r1", [WORLD], None),
                             RequestOutput("r1", [COMMA], None), RequestOutput("r1", [HELLO], "length")], direct=direct)
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body, send.bodies

    direct, sends = asyncio.run(run(True))
    asgi, asgi_sends = asyncio.run(run(False))
    assert direct == asgi and (sends, asgi_sends) == (2, 4)
    assert b'"token_ids":[1879]' in direct and direct.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_logprobs_stream_takes_the_plain_path_with_the_asgi_path_s_bytes(model: Model, chat: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens with top-2 logprobs between the first and the last never go through process(); one that
    ends inside a character has no text yet, so its entry goes out with the next token's."""
    split = model.tokenizer.encode("𓀀", add_special_tokens=False).ids
    assert len(split) > 1
    ids = [HELLO, WORLD, *split, COMMA, HELLO]

    def output(tid: int, finish: str | None = None) -> tuple[RequestOutput, list[bytes]]:
        frame = pack([tid, COMMA, tid], [-0.25, -1e-07, -0.25], [2])
        return RequestOutput("r1", [tid], finish, packed_logprobs=PackedLogprobs(0, 0, 1, 2)), [frame]

    async def run(direct: bool) -> tuple[bytes, int]:
        outputs, stream = _with_logprobs(model, chat=chat, tokens=9)
        processed: list[int] = []
        process, plain_text = OutputProcessor.process, OutputProcessor.plain_text
        monkeypatch.setattr(OutputProcessor, "process",
                            lambda self, outs: processed.append(len(outs)) or process(self, outs))
        monkeypatch.setattr(OutputProcessor, "plain_text", lambda self: queued.append(1) or plain_text(self))
        queued: list[int] = []
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle if direct else None))
        for i, tid in enumerate(ids):
            out, frames = output(tid, "length" if i == len(ids) - 1 else None)
            _offer(stream, out, frames)
            end_of_pass()
            await _settle(stream, out, direct=direct)
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        assert not direct or not queued  # each step went to the stream's plain step, none was queued
        return body, len(processed)

    direct, processed = asyncio.run(run(True))
    asgi, _ = asyncio.run(run(False))
    assert _events(direct) == _events(asgi)
    assert processed == 2  # the first token and the last: the rest took the plain step
    events = [json.loads(e.removeprefix(b"data: ")) for e in direct.split(b"\n\n") if e.startswith(b"data: {")]
    logprobs = [e["choices"][0]["logprobs"] for e in events if e["choices"] and e["choices"][0]["logprobs"]]
    if chat:
        tokens = [[entry["token"] for entry in lp["content"]] for lp in logprobs]
        assert [alt["token"] for alt in logprobs[0]["content"][0]["top_logprobs"]] == [",", "Hello"]
    else:
        tokens = [lp["tokens"] for lp in logprobs]
    assert tokens == [["Hello"], [" world"], ["", "𓀀"] if len(split) == 2 else [""] * (len(split) - 1) + ["𓀀"],
                      [","], ["Hello"]]


def test_the_dispatch_pass_gives_plain_steps_to_the_sink(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """EngineSet's pass over an engine's messages hands each plain step of a directly written stream to
    its sink (InFlight.plain): no process(), no plain_text(), nothing queued; two steps of the stream in
    one pass (two messages, the loop running late) still go out in one write, and the bytes are the ASGI
    path's."""
    from protocol import Outputs, Ready, encode
    from services.frontend.engine_client.bridge import DEALER
    from services.frontend.engine_client.engines import EngineSet

    calls: list[str] = []
    for name in ("process", "plain_text"):
        original = getattr(OutputProcessor, name)
        monkeypatch.setattr(OutputProcessor, name,
                            lambda self, *a, _f=original, _n=name: calls.append(_n) or _f(self, *a))

    async def run() -> tuple[bytes, list[str], list[int], int]:
        engines = EngineSet(["tcp://a:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
        engine = engines.engines[0]
        engines._on_ready(engine, Ready(0, "tiny", 4096, 16, 1000, "sim", "test", "e"), time.monotonic())
        outputs, stream, _, _ = _outputs(model)
        engine.inflight[stream.request_id] = stream
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle))
        seq = 0

        def dispatch(*steps: list[int] | tuple[list[int], str]) -> None:
            nonlocal seq
            batch = []
            for step in steps:
                seq += 1
                ids, finish = step if isinstance(step, tuple) else (step, None)
                message = Outputs(0, seq, [RequestOutput("r1", ids, finish)], time.time())
                batch.append((0, DEALER, encode(message)))
            engines._on_batch(batch, time.monotonic())

        dispatch([HELLO])
        await _attached(stream)
        assert stream.plain is not None
        calls.clear()
        writes = []
        for steps in ([[WORLD]], [[COMMA], [HELLO]]):
            before = transport.writes
            dispatch(*steps)
            writes.append(transport.writes - before)
            assert not stream.pending and stream.sink is not None
        middle = calls[:]
        dispatch(([WORLD], "length"))
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body, middle, writes, stream.generated

    direct, middle, writes, generated = asyncio.run(run())
    assert middle == [] and writes == [1, 1] and generated == 5
    outs = [RequestOutput("r1", [HELLO], None), RequestOutput("r1", [WORLD], None), RequestOutput("r1", [COMMA], None),
            RequestOutput("r1", [HELLO], None), RequestOutput("r1", [WORLD], "length")]
    asgi, _, _ = asyncio.run(_serve(model, outs, direct=False))
    assert _events(direct) == _events(asgi)


def test_a_plain_step_and_the_finish_in_one_pass_keep_their_order_when_the_write_is_refused(model: Model) -> None:
    """A pass carries a plain step (its body waits for the pass's end) and then the stream's finish (its
    events kept for the response task); the transport pauses before the pass writes: the step's body
    goes out before the finish's events."""
    async def run() -> bytes:
        stream, cycle, transport, task = await _under_way(model)
        plain = stream.plain
        assert plain is not None and plain(RequestOutput("r1", [WORLD], None), (), time.monotonic())
        stream.feed(RequestOutput("r1", [COMMA], "length"))  # declined by the step (a finish): queued, the end
        _pause(cycle)
        end_of_pass()
        _resume(cycle)
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body

    contents = [e.split('"content":', 1)[1].split('}', 1)[0] for e in _events(asyncio.run(run())) if '"content":' in e]
    assert contents == ['""', '"Hello"', '" world"', '","']


def test_a_logprobs_stream_goes_back_to_its_c_step_after_a_split_character(model: Model, step: str) -> None:
    """Chat with top-2 logprobs: the C step makes the entries of tokens whose cells are made; a character
    split over tokens is the Python step's (an entry that depends on the token before it), and after it
    the C step takes the stream again, the bytes the ASGI path's throughout."""
    split = model.tokenizer.encode("𓀀", add_special_tokens=False).ids
    ids = [HELLO, COMMA, HELLO, COMMA, *split, HELLO, COMMA, HELLO, WORLD]

    async def run(direct: bool) -> tuple[bytes, list[str]]:
        outputs, stream = _with_logprobs(model, chat=True, tokens=20)
        cycle, transport = _cycle()
        task = asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle if direct else None))
        takers = []
        for i, tid in enumerate(ids):
            frame = pack([tid, HELLO, COMMA], [-0.25, -1e-07, -3.5], [2])
            out = RequestOutput("r1", [tid], "length" if i == len(ids) - 1 else None,
                                packed_logprobs=PackedLogprobs(0, 0, 1, 2))
            takers.append(type(stream.plain).__name__)
            _offer(stream, out, [frame])
            end_of_pass()
            await _settle(stream, out, direct=direct)
        await task
        body, complete = _body(bytes(transport.data))
        assert complete
        return body, takers

    direct, takers = asyncio.run(run(True))
    asgi, _ = asyncio.run(run(False))
    assert _events(direct) == _events(asgi)
    n = len(split)
    if step == "c":  # the first token is process()'s; the split's bytes and the token after them Python's
        assert takers[2:4] == ["PlainStep"] * 2 and takers[-3:] == ["PlainStep"] * 3
        assert "method" in takers[4:5 + n]
    else:
        assert set(takers[1:]) == {"method"}
