"""Output processing in process: a Stream fed by hand, a fake EnginePort, the tiny model's tokenizer."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol import GenerateRequest, RequestOutput, SamplingParams
from services.frontend.metrics import Metrics
from services.frontend.model import Model
from services.frontend.output import OutputProcessor
from services.frontend.parsers import ParsedDelta, ToolCall, ToolCallDelta
from services.frontend.stream import CLIENT_GONE, EngineFailure, Stream
from services.frontend.translation import EngineRequest, OutputOptions

HELLO, WORLD, COMMA = 9707, 1879, 11  # "Hello", " world", ","
IM_END = 151645  # Qwen3's EOS


class _Engines:
    def __init__(self, accept: bool = True) -> None:
        self.aborted: list[str] = []
        self.placed: list[set[int]] = []
        self.accept = accept

    def abort(self, stream: Stream) -> None:
        self.aborted.append(stream.request_id)

    def place_again(self, stream: Stream, request: EngineRequest, exclude: set[int]) -> bool:
        self.placed.append(set(exclude))
        if self.accept:
            stream.engine_index = 1
        return self.accept


class _Upper:
    """A parser stand-in: upper-cases, holds back the last character until the next delta or flush;
    text after a "|" is reasoning; at flush it reports one tool call when `call` is set."""

    def __init__(self, call: bool = False) -> None:
        self.fed: list[str] = []
        self.held = ""
        self.flushes = 0
        self.call = call

    def push(self, delta: str) -> ParsedDelta:
        self.fed.append(delta)
        out, self.held = (self.held + delta)[:-1], (self.held + delta)[-1]
        return self._parsed(out)

    def flush(self) -> ParsedDelta:
        self.flushes += 1
        out, self.held = self.held, ""
        parsed = self._parsed(out)
        if self.call:
            parsed.tool_calls = [ToolCallDelta(0, "call_1", "f", "{}")]
        return parsed

    def calls(self) -> list[ToolCall]:
        return [ToolCall("call_1", "f", "{}")] if self.call else []

    @staticmethod
    def _parsed(text: str) -> ParsedDelta:
        content, _, reasoning = text.partition("|")
        return ParsedDelta(content.upper(), reasoning)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


def _processor(model: Model, engines: _Engines, *, stop: tuple[str, ...] = (), pinned: int | None = None,
               deltas: _Upper | None = None, skip: bool = True,
               include: bool = False) -> tuple[OutputProcessor, Stream, Metrics]:
    request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=8), time.time(),
                                            pinned_rank=pinned), 8,
                            OutputOptions(chat=False, stream=False, include_usage=False, continuous_usage=False,
                                          stop=stop, include_stop_str_in_output=include, skip_special_tokens=skip,
                                          tool_choice="auto"))
    stream = Stream("r1", 3, 8)
    stream.engine_index = 0
    metrics = Metrics("tiny")
    return OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=engines, metrics=metrics,
                           parser=deltas), stream, metrics


async def _drain(outputs: OutputProcessor) -> str:
    text = []
    while outputs.finish is None:
        text += [p if isinstance(p, str) else p.content for p in await outputs.pieces()]
    return "".join(text)


def _success(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("vllm:request_success_total",
                                             {"model_name": "tiny", "finished_reason": reason})


def test_text_counts_and_finish(model: Model) -> None:
    outputs, stream, metrics = _processor(model, _Engines())
    stream.feed(RequestOutput("r1", [HELLO, WORLD], None))
    stream.feed(RequestOutput("r1", [COMMA], "length"))
    assert asyncio.run(_drain(outputs)) == "Hello world,"
    assert (outputs.finish, outputs.completion_tokens, outputs.counts) == ("length", 3, [2, 3])
    assert outputs.usage(3) == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert _success(metrics, "length") == 1


def test_a_stop_string_finishes_and_aborts_at_the_engine(model: Model) -> None:
    engines = _Engines()
    outputs, stream, metrics = _processor(model, engines, stop=(" wor",))
    stream.feed(RequestOutput("r1", [HELLO], None))
    stream.feed(RequestOutput("r1", [WORLD], None))
    assert asyncio.run(_drain(outputs)) == "Hello"
    assert (outputs.finish, outputs.stop_reason, engines.aborted) == ("stop", " wor", ["r1"])
    assert _success(metrics, "stop") == 1


def test_a_draining_refusal_is_placed_again_then_served(model: Model) -> None:
    engines = _Engines()
    outputs, stream, _ = _processor(model, engines)
    stream.feed(RequestOutput("r1", [], "error", error="draining", error_kind="draining"))
    stream.feed(RequestOutput("r1", [HELLO], "length"))
    assert asyncio.run(_drain(outputs)) == "Hello"
    assert engines.placed == [{0}]


def test_a_pinned_request_is_not_moved_off_a_draining_rank(model: Model) -> None:
    engines = _Engines()
    outputs, stream, metrics = _processor(model, engines, pinned=0)
    stream.feed(RequestOutput("r1", [], "error", error="rank 0 is draining", error_kind="draining"))
    with pytest.raises(EngineFailure, match="rank 0 is draining") as info:
        asyncio.run(_drain(outputs))
    assert info.value.status == 503 and engines.placed == []
    assert _success(metrics, "error") == 1


def test_the_delta_processor_sees_text_after_stop_strings_and_is_flushed_once(model: Model) -> None:
    upper = _Upper()
    outputs, stream, _ = _processor(model, _Engines(), stop=(",",), deltas=upper)
    stream.feed(RequestOutput("r1", [HELLO], None))
    stream.feed(RequestOutput("r1", [WORLD, COMMA], None))
    assert asyncio.run(_drain(outputs)) == "HELLO WORLD"
    assert upper.fed == ["Hello", " world"] and upper.flushes == 1


def test_parser_deltas_with_reasoning_are_pieces_of_their_own_and_calls_finish_with_tool_calls(model: Model) -> None:
    parser = _Upper(call=True)
    outputs, stream, metrics = _processor(model, _Engines(), deltas=parser)
    stream.feed(RequestOutput("r1", [HELLO, COMMA], None))
    stream.feed(RequestOutput("r1", [WORLD, IM_END], "stop"))  # the EOS that ended it is no text
    pieces: list[object] = []
    while outputs.finish is None:
        pieces += asyncio.run(outputs.pieces())
    assert pieces == ["HELLO", ", WORL", ParsedDelta("D", "", [ToolCallDelta(0, "call_1", "f", "{}")])]
    assert outputs.calls == [ToolCall("call_1", "f", "{}")]
    assert outputs.finish == "tool_calls"
    assert _success(metrics, "stop") == 1  # metrics keep the engine's reason


def test_plain_content_from_a_parser_stays_a_str_piece(model: Model) -> None:
    outputs, stream, _ = _processor(model, _Engines(), deltas=_Upper())
    stream.feed(RequestOutput("r1", [HELLO, WORLD], "length"))
    pieces = asyncio.run(outputs.pieces())
    assert pieces == ["HELLO WORL", "D"] and outputs.counts == [2, 2] and outputs.calls == []
    assert outputs.finish == "length"


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("include", [False, True])
def test_the_token_that_stopped_a_request_is_no_text(model: Model, skip: bool, include: bool) -> None:
    """As vLLM: neither EOS (a special token shown when skip_special_tokens is false) nor a stop token id
    (which may be a regular token) is part of the text, unless include_stop_str_in_output; both count as
    completion tokens."""
    for last, text in ((IM_END, "" if skip else "<|im_end|>"), (COMMA, ",")):
        outputs, stream, _ = _processor(model, _Engines(), skip=skip, include=include)
        stream.feed(RequestOutput("r1", [HELLO], None))
        stream.feed(RequestOutput("r1", [WORLD, last], "stop", stop_reason=None if last == IM_END else last))
        assert asyncio.run(_drain(outputs)) == "Hello world" + (text if include else "")
        assert outputs.completion_tokens == 3


def _generated(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("vllm:generation_tokens_total", {"model_name": "tiny"})


def test_a_client_that_left_aborted_its_request_and_its_tokens_still_count(model: Model) -> None:
    """As vLLM: finished_reason "abort", not "error", and the tokens made before count."""
    outputs, stream, metrics = _processor(model, _Engines())
    stream.feed(RequestOutput("r1", [HELLO, WORLD], None))
    asyncio.run(outputs.pieces())
    stream.fail(CLIENT_GONE)
    with pytest.raises(EngineFailure):
        asyncio.run(outputs.pieces())
    assert (_success(metrics, "abort"), _success(metrics, "error"), _generated(metrics)) == (1, None, 2)


def test_an_engine_failure_is_an_error_and_its_tokens_still_count(model: Model) -> None:
    outputs, stream, metrics = _processor(model, _Engines())
    stream.feed(RequestOutput("r1", [HELLO], None))
    asyncio.run(outputs.pieces())
    stream.fail("engine rank 0 failed: its connection closed")
    with pytest.raises(EngineFailure):
        asyncio.run(outputs.pieces())
    assert (_success(metrics, "abort"), _success(metrics, "error"), _generated(metrics)) == (None, 1, 1)
