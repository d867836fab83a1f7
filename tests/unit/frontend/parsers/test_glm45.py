"""The glm45 tool and reasoning parsers: key/value calls typed by the tools' schemas, and reasoning,
however the output was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.glm45 import Glm45ToolParser, glm45
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": ["string", "null"]},
        "ratio": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
        "count": {"type": "integer"}, "flag": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "ping"}},
]


def call(name: str, *, newline: bool = True, **params: str) -> str:
    sep = "\n" if newline else ""
    body = "".join(f"<arg_key>{key}</arg_key>{sep}<arg_value>{value}</arg_value>{sep}" for key, value in params.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


CODE = 'def f():\n    return "}" + \'</tool_call>\' # </arg_key> <tool_call> 日本 🎉\n'
# (id, model output, final content, final calls as (name, arguments object), tags are real tags)
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]], bool]] = [
    ("plain", "No tools needed. <tool a> < b", "No tools needed. <tool a> < b", [], True),
    ("empty", "", "", [], True),
    ("one call", call("get_weather", city="Paris", days="3", metric="true"), "",
     [("get_weather", {"city": "Paris", "days": 3, "metric": True})], True),
    ("parallel", call("get_weather", city="Paris") + "\n" + call("get_weather", city="Oslo") + "\n", "",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})], True),
    ("text then a call", "Let me look.\n\n" + call("ping"), "Let me look.\n\n", [("ping", {})], True),
    ("text after a call", call("ping") + "\nDone.", "Done.", [("ping", {})], True),
    ("GLM-4.7 layout, no newlines", call("get_weather", newline=False, city="Rome", days="2"), "",
     [("get_weather", {"city": "Rome", "days": 2})], True),
    ("typed values", call("write", path="/tmp/ü.txt", ratio="2.50", tags='["a", 1, {"b": "}"}]',
                          opts='{"k": {"n": [1, 2]}, "s": "q\\"uote"}', count="7", flag="False", mode="null"), "",
     [("write", {"path": "/tmp/ü.txt", "ratio": 2.5, "tags": ["a", 1, {"b": "}"}],
                 "opts": {"k": {"n": [1, 2]}, "s": 'q"uote'}, "count": 7, "flag": False, "mode": None})], True),
    ("values that are not their type stay strings", call("write", count="seven", flag="yes", tags="[1, 2",
                                                         path="123"), "",
     [("write", {"count": "seven", "flag": "yes", "tags": "[1, 2", "path": "123"})], True),
    ("parameters without schema are JSON when they parse", call("ping", n="12", o='{"a": [1]}', s="hi", z="NaN"),
     "", [("ping", {"n": 12, "o": {"a": [1]}, "s": "hi", "z": "NaN"})], True),
    ("unicode and code with tags inside a value", "Ça va? " + call("write", path="a.py", content=CODE), "Ça va? ",
     [("write", {"path": "a.py", "content": CODE.strip()})], True),
    ("values and keys are stripped", "<tool_call>ping\n<arg_key> k </arg_key>  <arg_value>\n v \n</arg_value>"
                                     "</tool_call>", "", [("ping", {"k": "v"})], True),
    ("empty and blank string values", call("write", path="", content=" \n "), "",
     [("write", {"path": "", "content": ""})], True),
    ("a string value with inner whitespace", call("write", content="a  \n\n b\t"), "",
     [("write", {"content": "a  \n\n b"})], True),
    # Cut and malformed outputs.
    # A call the output ends inside of is never sent: its text is content, as the model wrote it.
    ("no end tag", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>",
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>", [], False),
    ("cut in a value", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro",
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro", [], False),
    ("cut in a value end tag", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>4</arg_v",
     "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>4</arg_v", [], False),
    ("cut in a key", "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>A</arg_value><arg_key>da",
     "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>A</arg_value><arg_key>da", [], False),
    ("cut in the name", "Hi <tool_call>get_wea", "Hi <tool_call>get_wea", [], False),
    ("empty name", "<tool_call>\n<arg_key>a</arg_key></tool_call> after",
     "<tool_call>\n<arg_key>a</arg_key></tool_call> after", [], False),
    ("a key without a value ends the pairs", "<tool_call>ping\n<arg_key>a</arg_key> junk <arg_key>b</arg_key>"
                                             "<arg_value>1</arg_value></tool_call>ok", "ok", [("ping", {})], True),
]


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: list[tuple[str, dict[str, Any]]],
                                               real: bool) -> None:
    expected = Final(content, "", tuple((name, args(obj)) for name, obj in calls))
    assert check_all_ways(lambda: Glm45ToolParser(TOOLS), text, expected, tags_are_real=real) > len(text)
    final, _ = drive(Glm45ToolParser(TOOLS), [text])
    assert [(name, json.loads(arguments)) for name, arguments in final.calls] == calls


def test_a_call_is_sent_whole_once_the_model_closed_it() -> None:
    parser = Glm45ToolParser(TOOLS)
    assert parser.push("Sure. <tool_call>get_weather").content == "Sure. "
    assert parser.push('\n<arg_key>city</arg_key><arg_value> Paris "x" \n').tool_calls == []
    assert parser.push("</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>").tool_calls == []
    done = parser.push("</tool_call>")
    assert [(d.index, d.name, json.loads(d.arguments)) for d in done.tool_calls] == [
        (0, "get_weather", {"city": 'Paris "x"', "days": 2})]
    assert json.loads(parser.calls()[0].arguments) == {"city": 'Paris "x"', "days": 2}


PLAIN = "[gMASK]<sop><|user|>\nhi<|assistant|>"
NO_THINKING = PLAIN + "\n<think></think>"
# (id, prompt, model output, final reasoning, final content, tags are real tags)
REASONING = [
    ("think then answer", PLAIN, "<think>Step 1.</think>\nThe answer.", "Step 1.", "The answer.", True),
    ("starts in reasoning", PLAIN, "Step 1.</think>The answer.", "Step 1.", "The answer.", True),
    ("never closed is all reasoning", PLAIN, "\n<think>still thinking", "still thinking", "", True),
    ("empty", PLAIN, "", "", "", True),
    ("unicode", PLAIN, "<think>日本語 🎉</think>Ça", "日本語 🎉", "Ça", True),
    ("thinking switched off", NO_THINKING, "\nJust an answer.", "", "\nJust an answer.", True),
]


@pytest.mark.parametrize(("prompt", "text", "reasoning", "content", "real"), [c[1:] for c in REASONING],
                         ids=[c[0] for c in REASONING])
def test_reasoning_every_splitting(prompt: str, text: str, reasoning: str, content: str, real: bool) -> None:
    check_all_ways(lambda: glm45(prompt), text, Final(content, reasoning, ()), tags_are_real=real)


def test_reasoning_then_a_call() -> None:
    text = "<think>The user wants the weather.</think>\n" + call("get_weather", city="Paris")
    expected = Final("", "The user wants the weather.", (("get_weather", args({"city": "Paris"})),))
    check_all_ways(lambda: build_parser("glm45", "glm45", tools=TOOLS, prompt=PLAIN), text, expected)  # type: ignore


@pytest.mark.parametrize("thinking", ["", "<think>The user wants the weather."], ids=["no thinking", "never closed"])
def test_a_call_ends_the_reasoning(thinking: str) -> None:
    """A call made without thinking first, or without closing the reasoning, is a call (as in vLLM), not
    reasoning text."""
    text = thinking + call("get_weather", city="Paris")
    expected = Final("", thinking.removeprefix("<think>"), (("get_weather", args({"city": "Paris"})),))
    check_all_ways(lambda: build_parser("glm45", "glm45", tools=TOOLS, prompt=PLAIN), text, expected)  # type: ignore


def test_the_names_are_vllms_flags() -> None:
    assert isinstance(build_parser("glm45", None), Glm45ToolParser)
    assert build_parser(None, "glm45") is not None
