"""Output processing in process: an InFlight fed by hand, a fake EnginePort, the tiny model's tokenizer."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol import GenerateRequest, RequestOutput, RequestTimings, SamplingParams
from services.frontend.engine_client.inflight import CLIENT_GONE, EngineFailure, InFlight
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.output import OutputProcessor
from services.frontend.model import Model
from services.frontend.parsers import ParsedDelta, ToolCall, ToolCallDelta
from services.frontend.requests.engine_request import EngineRequest, OutputOptions

HELLO, WORLD, COMMA = 9707, 1879, 11  # "Hello", " world", ","
IM_END = 151645  # Qwen3's EOS


class _Engines:
    def __init__(self, accept: bool = True) -> None:
        self.aborted: list[str] = []
        self.placed: list[set[int]] = []
        self.accept = accept

    def abort(self, stream: InFlight) -> None:
        self.aborted.append(stream.request_id)

    def place_again(self, stream: InFlight, request: EngineRequest, exclude: set[int]) -> bool:
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
               include: bool = False) -> tuple[OutputProcessor, InFlight, Metrics]:
    request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=8), time.time(),
                                            pinned_rank=pinned), 8,
                            OutputOptions(chat=False, stream=False, include_usage=False, continuous_usage=False,
                                          stop=stop, include_stop_str_in_output=include, skip_special_tokens=skip,
                                          tool_choice="auto"))
    stream = InFlight("r1", 3, 8)
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


def _phase(metrics: Metrics, name: str, rank: int = 2) -> tuple[float | None, float | None]:
    """A phase histogram's (count, sum) for engine `rank`."""
    labels = {"model_name": "tiny", "engine": str(rank)}
    get = metrics.registry.get_sample_value
    return get(f"vllm:request_{name}_count", labels), get(f"vllm:request_{name}_sum", labels)


def test_the_engines_timings_of_a_finished_request_are_observed_once_under_its_rank(model: Model) -> None:
    outputs, stream, metrics = _processor(model, _Engines())
    stream.rank = 2
    stream.feed(RequestOutput("r1", [HELLO], None, timings=RequestTimings(0.25, 0.5, 0.0, 0)))
    stream.feed(RequestOutput("r1", [WORLD], None))
    stream.feed(RequestOutput("r1", [COMMA], "length", timings=RequestTimings(0.25, 0.5, 1.5, 2)))
    asyncio.run(_drain(outputs))
    assert _phase(metrics, "queue_time_seconds") == (1, 0.25)
    assert _phase(metrics, "prefill_time_seconds") == (1, 0.5)
    assert _phase(metrics, "decode_time_seconds") == (1, 1.5)
    assert _phase(metrics, "inference_time_seconds") == (1, 2.0)  # prefill + decode, as vLLM
    assert _phase(metrics, "num_preemptions") == (1, 2)


def test_a_stop_string_finish_takes_the_first_tokens_timings_and_its_own_decode_time(model: Model) -> None:
    outputs, stream, metrics = _processor(model, _Engines(), stop=(" wor",))
    stream.rank = 2
    stream.feed(RequestOutput("r1", [HELLO], None, timings=RequestTimings(0.25, 0.5, 0.0, 1)))
    asyncio.run(outputs.pieces())
    stream.feed(RequestOutput("r1", [WORLD], None))
    asyncio.run(_drain(outputs))
    assert outputs.finish == "stop"
    assert _phase(metrics, "queue_time_seconds") == (1, 0.25)
    assert _phase(metrics, "prefill_time_seconds") == (1, 0.5)
    count, decode = _phase(metrics, "decode_time_seconds")
    assert count == 1 and decode is not None and 0.0 <= decode < 5.0  # between the two outputs' arrival here
    assert _phase(metrics, "inference_time_seconds") == (1, pytest.approx(0.5 + decode))
    assert _phase(metrics, "num_preemptions") == (1, 1)


def test_no_timings_from_an_older_engine_and_none_observed_for_a_client_that_left(model: Model) -> None:
    old, stream, metrics = _processor(model, _Engines())
    stream.rank = 2
    stream.feed(RequestOutput("r1", [HELLO], "length"))  # a protocol 1.3 engine sends no timings
    asyncio.run(_drain(old))
    assert _success(metrics, "length") == 1 and _phase(metrics, "queue_time_seconds") == (None, None)
    gone, stream, metrics = _processor(model, _Engines())
    stream.rank = 2
    stream.feed(RequestOutput("r1", [HELLO], None, timings=RequestTimings(0.25, 0.5, 0.0, 0)))
    asyncio.run(gone.pieces())
    stream.fail(CLIENT_GONE)
    with pytest.raises(EngineFailure):
        asyncio.run(gone.pieces())
    # As vLLM: an aborted request is not observed (its output processor drops it without its stats).
    assert _success(metrics, "abort") == 1 and _phase(metrics, "queue_time_seconds") == (None, None)


def test_an_engine_failure_is_an_error_and_its_tokens_still_count(model: Model) -> None:
    outputs, stream, metrics = _processor(model, _Engines())
    stream.feed(RequestOutput("r1", [HELLO], None))
    asyncio.run(outputs.pieces())
    stream.fail("engine rank 0 failed: its connection closed")
    with pytest.raises(EngineFailure):
        asyncio.run(outputs.pieces())
    assert (_success(metrics, "abort"), _success(metrics, "error"), _generated(metrics)) == (None, 1, 1)
def _lp_processor(model: Model, *, chat: bool = True, stop: tuple[str, ...] = (), echo: str | None = None,
                  deltas: _Upper | None = None, prompt: list[int] | None = None) -> tuple[OutputProcessor, InFlight]:
    prompt = prompt or [1, 2, 3]
    request = EngineRequest(GenerateRequest("r1", prompt, SamplingParams(max_tokens=8), time.time()), 8,
                            OutputOptions(chat=chat, stream=True, include_usage=False, continuous_usage=False,
                                          stop=stop, include_stop_str_in_output=False, skip_special_tokens=True,
                                          logprobs=1, prompt_logprobs=1 if echo else None, echo=echo))
    stream = InFlight("r1", len(prompt), 8)
    return OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=_Engines(), metrics=Metrics("tiny"),
                           parser=deltas), stream


def _feed(stream: InFlight, tokens: list[int], finish: str | None = None, prompt: list[int] | None = None) -> None:
    """An output with its logprobs: each token ranked 1st, its alternative the token after it."""
    from protocol import PackedLogprobs
    from protocol.logprobs import pack

    out = RequestOutput("r1", tokens, finish)
    raw = b""
    if prompt:
        out.packed_prompt_logprobs = PackedLogprobs(0, 0, len(prompt), 1)
        raw += pack([x for t in prompt for x in (t, t)], [-2.0] * 2 * len(prompt), [1] * len(prompt))
    out.packed_logprobs = PackedLogprobs(0, len(raw), len(tokens), 1)
    raw += pack([x for t in tokens for x in (t, t + 1)], [-1.0, -2.0] * len(tokens), [1] * len(tokens))
    stream.feed(out, [raw])


def _tokens(outputs: OutputProcessor, entries: list) -> list[str]:  # type: ignore[type-arg]
    import json

    assert outputs.formatter is not None
    rendered = json.loads(outputs.formatter.render(entries))
    return [e["token"] for e in rendered["content"]] if "content" in rendered else rendered["tokens"]


def test_each_piece_carries_the_logprobs_of_the_tokens_since_the_piece_before(model: Model) -> None:
    outputs, stream = _lp_processor(model, stop=(" world!",))
    _feed(stream, [HELLO])
    _feed(stream, [WORLD])  # held back: it could begin the stop string
    _feed(stream, [COMMA], "length")  # releases " world" and ","
    pieces = asyncio.run(outputs.pieces())
    assert pieces == ["Hello", " world,"]
    assert [_tokens(outputs, e) for e in outputs.logprobs] == [["Hello"], [" world", ","]]
    assert outputs.tail_logprobs == []


def test_logprobs_of_tokens_without_text_go_with_the_finish(model: Model) -> None:
    outputs, stream = _lp_processor(model)
    _feed(stream, [HELLO])
    _feed(stream, [IM_END], "stop")  # the EOS: no text, but a token the engine generated
    assert asyncio.run(outputs.pieces()) == ["Hello"]
    assert _tokens(outputs, outputs.tail_logprobs) == ["<|im_end|>"]


def test_with_a_parser_every_token_has_logprobs_reasoning_and_tags_included(model: Model) -> None:
    outputs, stream = _lp_processor(model, deltas=_Upper())
    _feed(stream, [HELLO])
    _feed(stream, [WORLD], "length")
    pieces = asyncio.run(outputs.pieces())
    assert pieces == ["HELL", "O WORL", "D"]
    assert [_tokens(outputs, e) for e in outputs.logprobs] == [["Hello"], [" world"], []]


def test_echo_puts_the_prompt_and_its_logprobs_before_the_first_token(model: Model) -> None:
    outputs, stream = _lp_processor(model, chat=False, echo="Hello world", prompt=[HELLO, WORLD])
    _feed(stream, [COMMA], prompt=[WORLD])
    _feed(stream, [WORLD], "length")
    pieces: list[object] = []
    entries: list[object] = []
    while outputs.finish is None:
        pieces += asyncio.run(outputs.pieces())
        for e in outputs.logprobs:
            entries += e
    assert pieces == ["Hello world,", " world"]
    assert _tokens(outputs, entries) == ["Hello", " world", ",", " world"]
    import json

    assert outputs.formatter is not None
    assert json.loads(outputs.formatter.render(entries))["text_offset"] == [0, 5, 11, 12]


def test_unreadable_logprobs_fail_the_request_not_the_process(model: Model) -> None:
    from protocol import PackedLogprobs

    outputs, stream = _lp_processor(model)
    out = RequestOutput("r1", [HELLO], None)
    out.packed_logprobs = PackedLogprobs(3, 0, 1, 1)
    stream.feed(out, [b""])
    with pytest.raises(EngineFailure, match="unreadable logprobs"):
        asyncio.run(outputs.pieces())


@pytest.mark.parametrize("first", [True, False], ids=["first-token", "plain-step"])
def test_a_negative_logprobs_token_id_fails_the_request_naming_it(model: Model, first: bool) -> None:
    """Read as an index, -1 would name the tables' last token (and, made there, overwrite its cached
    string for every later request): the request fails, on process()'s path and the plain short path's."""
    from protocol import PackedLogprobs
    from protocol.logprobs import pack

    outputs, stream = _lp_processor(model)
    if not first:
        _feed(stream, [HELLO])
        asyncio.run(outputs.pieces())
    out = RequestOutput("r1", [WORLD], None)
    out.packed_logprobs = PackedLogprobs(0, 0, 1, 1)
    stream.feed(out, [pack([WORLD, -1], [-1.0, -2.0], [1])])
    assert outputs.plain_text() is None  # the short path leaves it to process()
    with pytest.raises(EngineFailure, match="unreadable logprobs: .*token id -1: token ids are 0 or more"):
        asyncio.run(outputs.pieces())


def test_an_id_far_past_the_vocabulary_is_an_empty_token_and_grows_no_cache(model: Model) -> None:
    """2**31 - 1 as an alternative: shown as any id past the tokenizer's ("", no bytes), as the plain short
    path and process() both make it, without the per-tokenizer tables growing to its length."""
    from services.frontend.text.token_strings import PAST_VOCABULARY

    outputs, stream = _lp_processor(model)
    _feed(stream, [HELLO])
    asyncio.run(outputs.pieces())
    import json

    for n, tid in enumerate((2 ** 31 - 2, model.tokenizer.get_vocab_size(with_added_tokens=True) + PAST_VOCABULARY)):
        _feed(stream, [tid])  # its own token the id, its alternative the id after it
        assert outputs.plain_text() == ""  # no text: its entry waits for the next piece's
        assert outputs.formatter is not None
        entry = json.loads(outputs.formatter.render(outputs._pending))["content"][n]
        assert (entry["token"], entry["bytes"]) == ("", [])
        assert [(alt["token"], alt["bytes"]) for alt in entry["top_logprobs"]] == [("", [])]
    assert outputs.formatter is not None
    table = outputs.formatter._table
    assert len(table.heads) < table.limit and len(outputs.formatter._strings._alone) < table.limit


def test_a_plain_step_takes_the_short_path_with_process_s_result(model: Model) -> None:
    outputs, stream, _ = _processor(model, _Engines())
    assert outputs.plain_text() is None  # nothing queued
    stream.feed(RequestOutput("r1", [HELLO], None))
    assert outputs.plain_text() is None  # the first token: its TTFT and cached tokens are process()'s
    assert outputs.take_pieces() == ["Hello"]
    stream.feed(RequestOutput("r1", [WORLD], None))
    assert outputs.plain_text() == " world" and not stream.pending
    assert (outputs.completion_tokens, outputs.counts) == (2, [2])
    stream.feed(RequestOutput("r1", [COMMA], None))
    stream.feed(RequestOutput("r1", [HELLO], None))
    assert outputs.plain_text() is None and len(stream.pending) == 2  # two queued: process() takes them
    assert outputs.take_pieces() == [",", "Hello"]
    stream.feed(RequestOutput("r1", [WORLD], "length"))
    assert outputs.plain_text() is None  # the finish is process()'s
    assert outputs.take_pieces() == [" world"] and outputs.finish == "length"


def test_several_plain_steps_queued_at_once_take_the_short_path_with_process_s_result(model: Model) -> None:
    """A loop running late finds several steps of a stream queued: plain_texts() gives process()'s text
    pieces, counts and latencies, a character split across steps included."""
    split = model.tokenizer.encode("𓀀", add_special_tokens=False).ids
    assert len(split) > 1
    late = [RequestOutput("r1", [WORLD], None), *(RequestOutput("r1", [tid], None) for tid in split),
            RequestOutput("r1", [COMMA, HELLO], None)]
    results = []
    for short in (True, False):
        outputs, stream, metrics = _processor(model, _Engines())
        stream.feed(RequestOutput("r1", [HELLO], None))
        assert outputs.plain_texts() is None  # the first token: process()'s
        outputs.take_pieces()
        for out in late:
            stream.feed(out)
        texts = outputs.plain_texts() if short else outputs.take_pieces()
        assert not stream.pending
        results.append((texts, outputs.counts, outputs.completion_tokens, sum(metrics.itl.counts[:-1])))
    assert results[0] == results[1]
    assert results[0][:3] == ([" world", "𓀀", ",Hello"], [2, 2 + len(split), 4 + len(split)], 4 + len(split))
    assert results[0][3] == len(late)  # one inter-token latency per step, as process() observes


def test_several_queued_steps_with_a_finish_are_left_to_process(model: Model) -> None:
    outputs, stream, _ = _processor(model, _Engines())
    stream.feed(RequestOutput("r1", [HELLO], None))
    outputs.take_pieces()
    stream.feed(RequestOutput("r1", [WORLD], None))
    stream.feed(RequestOutput("r1", [COMMA], "length"))
    assert outputs.plain_texts() is None and len(stream.pending) == 2
    assert outputs.take_pieces() == [" world", ","] and outputs.finish == "length"


def test_a_request_with_stop_strings_never_takes_the_short_path(model: Model) -> None:
    outputs, stream, _ = _processor(model, _Engines(), stop=("xyz",))
    stream.feed(RequestOutput("r1", [HELLO], None))
    outputs.take_pieces()
    stream.feed(RequestOutput("r1", [WORLD], None))
    assert outputs.plain_text() is None and len(stream.pending) == 1
    stream.feed(RequestOutput("r1", [COMMA], None))
    assert outputs.plain_texts() is None and len(stream.pending) == 2
