"""The llama3_json tool parser: JSON calls anywhere in the output, however it was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers.llama3_json import Llama3JsonToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

TRICKY = {"q": "naïve 日本語 🎉", "nested": {"a": [1, {"b": "}"}], "s": 'quote " } ] ; <|python_tag|>'}}


def call(name: str, arguments: dict[str, Any], key: str = "parameters") -> str:
    return f'{{"name": {json.dumps(name)}, "{key}": {args(arguments)}}}'


# (id, model output, final content, final calls)
CASES = [
    ("plain", "The weather is fine; {not json}.", "The weather is fine; {not json}.", ()),
    ("empty", "", "", ()),
    ("one call", call("get_weather", {"city": "Paris"}), "", (("get_weather", args({"city": "Paris"})),)),
    ("python tag", "<|python_tag|>" + call("f", {"a": 1}), "", (("f", args({"a": 1})),)),
    ("arguments key", call("f", {"a": 1}, key="arguments"), "", (("f", args({"a": 1})),)),
    ("parallel", call("f", {"a": 1}) + "; " + call("g", {}) + ";\n" + call("h", {"x": [1]}), "",
     (("f", args({"a": 1})), ("g", "{}"), ("h", args({"x": [1]})))),
    ("leading whitespace", "\n " + call("f", TRICKY), "", (("f", args(TRICKY)),)),
    ("other key order", '{"parameters": {"a": "é"}, "name": "f"}', "", (("f", '{"a": "é"}'),)),
    ("extra keys after the arguments", '{"name": "f", "parameters": {"a": 1}, "type": "function"}', "",
     (("f", '{"a": 1}'),)),
    ("text after the calls", call("f", {}) + "\n\nThat is all.", "That is all.", (("f", "{}"),)),
    ("text, then a call", "Sure, let me check.\n" + call("f", {"a": 1}), "Sure, let me check.\n",
     (("f", args({"a": 1})),)),
    ("text, a call, text, a call", "A " + call("f", {}) + " then " + call("g", {}) + " done", "A then done",
     (("f", "{}"), ("g", "{}"))),
    ("braces in prose", "Use {x} or { y } here.", "Use {x} or { y } here.", ()),
    ("a JSON answer is content", '{"answer": 42} and more', '{"answer": 42} and more', ()),
    ("cut before the name", '{"name": "get_wea', '{"name": "get_wea', ()),
    # What is not a complete call object is content as the model wrote it, as in vLLM: never a call
    # the model did not finish.
    ("cut in the arguments", '{"name": "f", "parameters": {"a": "x', '{"name": "f", "parameters": {"a": "x', ()),
    ("the object never closed", '{"name": "f", "parameters": {"a": 1}', '{"name": "f", "parameters": {"a": 1}', ()),
    ("malformed", '{"name": "f", "parameters": {"a": 1,}}', '{"name": "f", "parameters": {"a": 1,}}', ()),
    ("a call, then a malformed one", call("f", {}) + '; {"name": "g", "parameters": {"b": tru}}',
     '{"name": "g", "parameters": {"b": tru}}', (("f", "{}"),)),
    ("cut in the python tag", "<|python_t", "<|python_t", ()),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str], ...]) -> None:
    check_all_ways(Llama3JsonToolParser, text, Final(content, "", calls), tags_are_real=True)


def test_a_call_is_sent_whole_once_its_object_closes() -> None:
    parser = Llama3JsonToolParser()
    assert parser.push("Sure. ").content == "Sure. "
    first = parser.push('{"name": "f", "parameters": {"a": "lo')
    assert first.tool_calls == [] and first.content == ""
    done = parser.push('ng"}}')
    assert [(d.index, d.name, d.arguments) for d in done.tool_calls] == [(0, "f", '{"a": "long"}')]
    assert parser.flush() == type(first)()
    assert json.loads(parser.calls()[0].arguments) == {"a": "long"}


def test_no_python_tag_in_content_when_it_opens_calls() -> None:
    _, deltas = drive(Llama3JsonToolParser(), list("<|python_tag|>" + call("f", {})))
    assert all(not d.content for d in deltas)
