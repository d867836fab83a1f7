"""The openai (gpt-oss harmony) parser: what a client sees of each model output, fed as token ids
of the harmony encoding (the gpt-oss tokenizer) whole, one by one, in random runs and in every two
runs; and the checks around it (start-up, flags, requests, output processing)."""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import GenerateRequest, RequestOutput, SamplingParams
from services.frontend.config import parse_args
from services.frontend.engine_client.inflight import InFlight
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.output import OutputProcessor
from services.frontend.model import Model
from services.frontend.parsers import ParsedDelta, build_parser
from services.frontend.parsers.harmony import MARKERS, HarmonyParser, encoding, tokenizer_problem
from services.frontend.requests.engine_request import EngineRequest, OutputOptions
from tests.unit.frontend.parsers.harness import Final, args, openai_id, reassemble

ANALYSIS = "<|channel|>analysis<|message|>{}<|end|><|start|>assistant"
FINAL = "<|channel|>final<|message|>{}<|return|>"
PREAMBLE = "<|channel|>commentary<|message|>{}<|end|><|start|>assistant"
TRICKY = {"q": "naïve café 日本語 🎉", "nested": {"a": [1, {"b": "}"}, [], {}], "t": True, "n": None},
          "s": 'quote " brace } <|call|> <|end|> as text', "back": "\\", "x": -1.5e3}


LITERAL = "\x00"  # text between two of these is what the model wrote as text, markers and all


def call(name: str, arguments: dict[str, Any], *, end: str = "<|call|>") -> str:
    body = LITERAL + args(arguments) + LITERAL
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}{end}"


def then(*messages: str) -> str:
    """Messages after the first: each opens with <|start|>assistant (the last call ends the output)."""
    return "<|start|>assistant".join(messages)


# (id, model output, read calls, final content, reasoning, calls as (name, arguments))
CASES: list[tuple[str, str, bool, str, str, tuple[tuple[str, str], ...]]] = [
    ("final only", FINAL.format("Hello, world."), True, "Hello, world.", "", ()),
    ("reasoning then final", ANALYSIS.format("Think é 🎉.") + FINAL.format("Paris."), True, "Paris.",
     "Think é 🎉.", ()),
    ("reasoning then a call", ANALYSIS.format("Need weather.") + call("get_weather", {"city": "SF"}), True, "",
     "Need weather.", (("get_weather", args({"city": "SF"})),)),
    ("a preamble then a call", PREAMBLE.format("Checking.") + call("f", {}), True, "Checking.", "",
     (("f", "{}"),)),
    ("parallel calls", then(call("f", {"a": 1}, end="<|end|>"), call("g", {"b": [2]})), True, "", "",
     (("f", args({"a": 1})), ("g", args({"b": [2]})))),
    ("unicode and nested arguments", ANALYSIS.format("x") + call("search", TRICKY), True, "", "x",
     (("search", args(TRICKY)),)),
    ("the recipient before the channel",
     "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
     "<|message|>{}<|call|>", True, "", "r", (("f", "{}"),)),
    ("a call read without calls is content", call("f", {"a": 1}), False, args({"a": 1}), "", ()),
    ("a built-in tool's message is reasoning",
     "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|call|>", True, "",
     '{"query": "x"}', ()),
    ("no header at all is content", "just text, no harmony", True, "just text, no harmony", "", ()),
    ("a token out of place ends the reading", FINAL.format("a").replace("<|return|>", "<|end|>") + "junk<|end|>",
     True, "ajunk", "", ()),
    ("cut inside a header", ANALYSIS.format("r") + "<|channel|>comm", True, "", "r", ()),
    ("cut inside a call", ANALYSIS.format("r") + call("f", {"a": "partial"})[:-len('tial"}\x00<|call|>')], True, "",
     "r", (("f", '{"a": "par'),)),
    ("cut inside the final", "<|channel|>final<|message|>Hel", True, "Hel", "", ()),
    ("empty", "", True, "", "", ()),
]


def ids_of(text: str) -> list[int]:
    """Harmony's ids for an output: markers are special tokens, except inside LITERAL text."""
    enc, ids = encoding(), []
    for i, part in enumerate(text.split(LITERAL)):
        ids += enc.encode(part, disallowed_special=()) if i % 2 else enc.encode(part, allowed_special="all")
    return ids


def runs(ids: list[int], *, seeds: int = 40) -> Iterator[tuple[str, list[list[int]]]]:
    """(label, runs of ids): whole, one id each, seeded random runs, every two-run split."""
    yield "whole", [ids]
    yield "tokens", [[i] for i in ids]
    for seed in range(seeds):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(ids)), min(len(ids) - 1, rng.randint(1, 8)))) if len(ids) > 1 else []
        bounds = [0, *cuts, len(ids)]
        yield f"random[{seed}]", [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    for cut in range(1, len(ids)):
        yield f"split[{cut}]", [ids[:cut], ids[cut:]]


def drive(calls: bool, chunks: list[list[int]]) -> tuple[Final, list[ParsedDelta]]:
    parser = HarmonyParser(calls=calls)
    deltas = [parser.push_tokens(chunk) for chunk in chunks]
    deltas.append(parser.flush())
    return reassemble(parser, deltas), deltas


@pytest.mark.parametrize(("text", "calls", "content", "reasoning", "expected"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_every_way_of_feeding_the_ids_gives_the_same_message(text: str, calls: bool, content: str, reasoning: str,
                                                             expected: tuple[tuple[str, str], ...]) -> None:
    want = Final(content, reasoning, expected)
    for label, chunks in runs(ids_of(text)):
        final, deltas = drive(calls, chunks)
        assert final == want, f"{label}: {chunks}"
        for delta in deltas:
            for piece in (delta.content, delta.reasoning):
                assert not any(m in piece for m in MARKERS), f"{label}: a marker leaked into {piece!r}"


def test_a_call_streams_its_name_first_then_each_token_of_its_arguments() -> None:
    parser = HarmonyParser(calls=True)
    deltas = [parser.push_tokens([i]) for i in ids_of(call("get_weather", {"city": "Paris"}))]
    firsts = [d.tool_calls[0] for d in deltas if d.tool_calls and d.tool_calls[0].name]
    assert len(firsts) == 1 and firsts[0].name == "get_weather" and firsts[0].arguments == ""
    assert openai_id(firsts[0].id or "")
    fragments = [d.tool_calls[0].arguments for d in deltas if d.tool_calls and not d.tool_calls[0].name]
    assert len(fragments) > 3 and "".join(fragments) == args({"city": "Paris"})
    assert json.loads(parser.calls()[0].arguments) == {"city": "Paris"}


def test_the_names_and_the_harmony_parser_from_the_registry() -> None:
    assert isinstance(build_parser("openai", "openai"), HarmonyParser)
    assert isinstance(build_parser(None, "openai_gptoss"), HarmonyParser)  # vLLM's reasoning-parser name
    only_reasoning = build_parser(None, "openai")
    assert isinstance(only_reasoning, HarmonyParser)
    only_reasoning.push_tokens(ids_of(call("f", {})))
    assert only_reasoning.calls() == []  # not read for calls: their text is content


def test_the_flags_refuse_harmony_beside_another_format() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--tool-call-parser", "hermes", "--reasoning-parser", "openai"])
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--tool-call-parser", "openai", "--reasoning-parser", "qwen3"])
    config = parse_args(["--model", "tiny", "--enable-auto-tool-choice", "--tool-call-parser", "openai"])
    assert config.harmony and not parse_args(["--model", "tiny"]).harmony


def test_start_up_refuses_a_tokenizer_that_is_not_gpt_oss() -> None:
    tiny = Model.load("tiny", "tiny")
    problem = tokenizer_problem(tiny.tokenizer.token_to_id)
    assert problem is not None and "<|start|>" in problem and "200006" in problem
    harmony_ids = {m: ids_of(m)[0] for m in MARKERS}
    assert tokenizer_problem(harmony_ids.get) is None


def test_output_processing_feeds_every_id_to_the_harmony_parser() -> None:
    """The engine's ids, the final <|call|> too, reach the parser; calls finish with tool_calls."""
    ids = ids_of(ANALYSIS.format("Why.") + call("f", {"a": 1}))
    request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=64), time.time()), 64,
                            OutputOptions(chat=True, stream=True, include_usage=False, continuous_usage=False,
                                          stop=(), include_stop_str_in_output=False, skip_special_tokens=True,
                                          tool_choice="auto"))
    stream = InFlight("r1", 3, 64)
    stream.engine_index = 0

    class Engines:
        def abort(self, stream: InFlight) -> None:
            raise AssertionError("nothing to abort")

        def place_again(self, stream: InFlight, request: EngineRequest, exclude: set[int]) -> bool:
            return False

    outputs = OutputProcessor(stream, request, tokenizer=Model.load("tiny", "tiny").tokenizer, engines=Engines(),
                              metrics=Metrics("tiny"), parser=HarmonyParser(calls=True))
    for i in range(0, len(ids) - 1, 3):
        stream.feed(RequestOutput("r1", ids[i:min(i + 3, len(ids) - 1)], None))
    stream.feed(RequestOutput("r1", ids[-1:], "stop", stop_reason=ids[-1]))
    pieces: list[object] = []
    while outputs.finish is None:
        pieces += asyncio.run(outputs.pieces())
    reasoning = "".join(p.reasoning for p in pieces if isinstance(p, ParsedDelta))
    assert reasoning == "Why." and not any(isinstance(p, str) for p in pieces)
    assert [(c.name, c.arguments) for c in outputs.calls] == [("f", args({"a": 1}))]
    assert outputs.finish == "tool_calls" and outputs.completion_tokens == len(ids) and outputs.parsing
