"""The hermes tool parser: what a client sees of each model output, however it was split."""
from __future__ import annotations

import json

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.hermes import HermesToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive, hermes_call

WEATHER = {"city": "Paris", "days": 3}
TRICKY = {"q": "naïve café 日本語 🎉", "nested": {"a": [1, {"b": "}"}, [], {}], "t": True, "n": None},
          "s": 'quote " brace } bracket ] tags </tool_call> <tool_call> <think>', "back": "\\", "x": -1.5e3}

# (id, model output, final content, final calls, tags are real tags)
CASES = [
    ("plain", "Hello, world. a < b and {json} </tool", "Hello, world. a < b and {json} </tool", (), True),
    ("empty", "", "", (), True),
    ("one call", hermes_call("get_weather", WEATHER), "", (("get_weather", args(WEATHER)),), True),
    ("parallel", hermes_call("f", {"a": 1}) + "\n" + hermes_call("g", {"b": [2]}) + "\n", "",
     (("f", args({"a": 1})), ("g", args({"b": [2]}))), True),
    ("text then calls", "Let me check.\n\n" + hermes_call("f", {}) + "\n" + hermes_call("g", WEATHER),
     "Let me check.\n\n", (("f", "{}"), ("g", args(WEATHER))), True),
    ("text after a call", hermes_call("f", {"a": 1}) + "\n\nDone: see above.", "Done: see above.",
     (("f", args({"a": 1})),), True),
    ("unicode and nested", "Ça va? " + hermes_call("search", TRICKY), "Ça va? ", (("search", args(TRICKY)),), True),
    ("escaped name", hermes_call('we"ird', {"a": 1}), "", (('we"ird', args({"a": 1})),), True),
    ("compact JSON", '<tool_call>{"name":"f","arguments":{"a":{"b":"}"}}}</tool_call>', "",
     (("f", '{"a": {"b": "}"}}'),), True),
    ("no end tag", '<tool_call>\n{"name": "f", "arguments": {"x": 1}}', "", (("f", '{"x": 1}'),), True),
    ("other key order", '<tool_call>\n{"arguments": {"x": "é"}, "name": "f"}\n</tool_call>', "",
     (("f", '{"x": "é"}'),), True),
    ("arguments as a string", '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>', "",
     (("f", '{"x": 1}'),), True),
    # Malformed and cut outputs: what could not be a call comes back as content, tags and all (as vLLM
    # returns it); never a call whose arguments are not the complete object the model wrote.
    ("malformed body", 'A <tool_call>\n{"name": "f", "arguments": }\n</tool_call> B',
     'A <tool_call>\n{"name": "f", "arguments": }\n</tool_call> B', (), False),
    ("no name", '<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>', (),
     False),
    ("cut in the header", 'Hi <tool_call>\n{"name": "f", "argu', 'Hi <tool_call>\n{"name": "f", "argu', (), False),
    ("cut in the start tag", "Hi <tool_ca", "Hi <tool_ca", (), False),
    ("cut in the arguments", 'Hi <tool_call>\n{"name": "f", "arguments": {"a": "par',
     'Hi <tool_call>\n{"name": "f", "arguments": {"a": "par', (), False),
    ("cut in the end tag", hermes_call("f", {"a": 1})[:-3], hermes_call("f", {"a": 1})[:-3], (), False),
    ("unclosed object", '<tool_call>\n{"name": "f", "arguments": {"a": 1\n</tool_call>\nok',
     '<tool_call>\n{"name": "f", "arguments": {"a": 1\n</tool_call>\nok', (), False),
    ("trailing comma", '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>',
     '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>', (), False),
    ("a call, then a malformed one",
     hermes_call("f", {"a": 1}) + '\n<tool_call>\n{"name": "g", "arguments": {"b": tru}}\n</tool_call>',
     '<tool_call>\n{"name": "g", "arguments": {"b": tru}}\n</tool_call>', (("f", args({"a": 1})),), False),
    ("no end tag before the next call", '<tool_call>\n{"name": "f", "arguments": {}}\n' + hermes_call("g", {}), "",
     (("f", "{}"), ("g", "{}")), True),
]


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str], ...],
                                               real: bool) -> None:
    assert check_all_ways(HermesToolParser, text, Final(content, "", calls), tags_are_real=real) > len(text)


def test_complete_arguments_are_the_json_of_the_object() -> None:
    final, _ = drive(HermesToolParser(), [hermes_call("search", TRICKY)])
    assert json.loads(final.calls[0][1]) == TRICKY


def test_a_call_is_sent_whole_once_its_block_has_ended() -> None:
    parser = HermesToolParser()
    assert parser.push("Sure. <tool_call>\n").content == "Sure. "
    assert parser.push('{"name": "f", "arguments": {"a": "lo').tool_calls == []
    assert parser.push('ng"}}\n</tool_c').tool_calls == []
    done = parser.push("all>")
    assert [(d.index, d.name, d.arguments) for d in done.tool_calls] == [(0, "f", '{"a": "long"}')]
    assert done.tool_calls[0].id is not None


def test_a_partial_tag_is_held_then_released_when_it_stops_matching() -> None:
    parser = HermesToolParser()
    assert parser.push("a <tool").content == "a "
    assert parser.push("box> b").content == "<toolbox> b"
    assert parser.flush().content == ""


def test_reasoning_then_a_call() -> None:
    text = "<think>\nThe user wants the weather: call get_weather.\n</think>\n\n" + hermes_call("get_weather", WEATHER)
    expected = Final("", "\nThe user wants the weather: call get_weather.\n", (("get_weather", args(WEATHER)),))

    def make() -> HermesToolParser:
        parser = build_parser("hermes", "qwen3")
        assert parser is not None
        return parser  # type: ignore[return-value]

    check_all_ways(make, text, expected)


def test_reasoning_opened_by_the_prompt_then_text_then_a_call() -> None:
    text = "Thinking about </tool_call> tags.</think>\n\nChecking." + hermes_call("f", {"a": "</think>"})
    expected = Final("Checking.", "Thinking about </tool_call> tags.", (("f", args({"a": "</think>"})),))
    check_all_ways(lambda: build_parser("hermes", "qwen3", prompt="<|im_start|>assistant\n<think>\n"),  # type: ignore
                   text, expected, tags_are_real=False)
