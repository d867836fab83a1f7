"""The qwen3_coder tool parser: XML-style calls typed by the tools' schemas, however the output was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.qwen3_coder import Qwen3CoderToolParser, SeedOssToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": ["string", "null"]},
        "ratio": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "count": {"type": "integer"},
        "flag": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "ping"}},
]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CODE = 'def f():\n    return "}" + \'</parameter>\' # </function> </tool_call> 日本 🎉\n'
# (id, model output, final content, final calls as (name, arguments object), tags are real tags)
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]], bool]] = [
    ("plain", "No tools needed. <function a> < b", "No tools needed. <function a> < b", [], True),
    ("one call", call("get_weather", city="Paris", days="3", metric="True"), "",
     [("get_weather", {"city": "Paris", "days": 3, "metric": True})], True),
    ("parallel", call("get_weather", city="Paris") + "\n" + call("get_weather", city="Oslo") + "\n", "",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})], True),
    ("text then a call", "Let me look.\n\n" + call("ping"), "Let me look.\n\n", [("ping", {})], True),
    ("text after a call", call("ping") + "\nDone.", "Done.", [("ping", {})], True),
    ("typed values", call("write", path="/tmp/ü.txt", ratio="2.50", tags='["a", 1, {"b": "}"}]',
                          opts='{"k": {"n": [1, 2]}, "s": "q\\"uote"}', count="7", flag="false", mode="null",
                          note="None"), "",
     [("write", {"path": "/tmp/ü.txt", "ratio": 2.5, "tags": ["a", 1, {"b": "}"}],
                 "opts": {"k": {"n": [1, 2]}, "s": 'q"uote'}, "count": 7, "flag": False, "mode": None,
                 "note": None})], True),
    ("values that are not their type stay strings", call("write", count="seven", ratio="nan", flag="yes",
                                                         tags="[1, 2", path="null"), "",
     [("write", {"count": "seven", "ratio": "nan", "flag": "yes", "tags": "[1, 2", "path": "null"})], True),
    ("whole numbers and unknown parameters", call("write", ratio="3.0", extra="12", unknown_fn_param="x"), "",
     [("write", {"ratio": 3, "extra": "12", "unknown_fn_param": "x"})], True),
    ("a function without schema", call("nope", a="1", b='{"x": 1}'), "", [("nope", {"a": "1", "b": '{"x": 1}'})],
     True),
    ("code with tags inside a value", call("write", path="a.py", content=CODE), "",
     [("write", {"path": "a.py", "content": CODE})], True),
    ("multi-line value keeps inner newlines", call("write", content="\n\nline\n\n"), "",
     [("write", {"content": "\n\nline\n\n"})], True),
    # A call the output ends inside of is never sent: its text is content, as the model wrote it.
    ("no end tags at all", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome", [], False),
    ("cut in a parameter end tag", "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</param",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</param", [], False),
    ("cut after a parameter", "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</parameter>\n<para",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</parameter>\n<para", [], False),
    ("a call not closed, then a call", "<tool_call>\n<function=ping>\n/function>\n</tool_call>\n" + call("ping"),
     "<tool_call>\n<function=ping>\n/function>\n</tool_call>\n", [("ping", {})], False),
    ("cut in the function tag", "Hi <tool_call>\n<function=get_wea", "Hi <tool_call>\n<function=get_wea", [], False),
    ("missing function tag", "<tool_call>\n{\"name\": \"f\"}\n</tool_call> after",
     "<tool_call>\n{\"name\": \"f\"}\n</tool_call> after", [], False),
    ("function closed without tool_call end", "<tool_call>\n<function=ping>\n</function>", "", [("ping", {})], True),
]


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: list[tuple[str, dict[str, Any]]],
                                               real: bool) -> None:
    expected = Final(content, "", tuple((name, args(obj)) for name, obj in calls))
    check_all_ways(lambda: Qwen3CoderToolParser(TOOLS), text, expected, tags_are_real=real)
    final, _ = drive(Qwen3CoderToolParser(TOOLS), [text])
    assert [(name, json.loads(arguments)) for name, arguments in final.calls] == calls


def test_a_call_is_sent_whole_once_the_model_closed_it() -> None:
    parser = Qwen3CoderToolParser(TOOLS)
    assert parser.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar").tool_calls == []
    assert parser.push('is "X"\n\n</parameter>\n<parameter=days>\n2\n</parameter>\n').tool_calls == []
    done = parser.push("</function>\n</tool_call>")
    assert [(d.index, d.name, json.loads(d.arguments)) for d in done.tool_calls] == [
        (0, "get_weather", {"city": 'Paris "X"\n', "days": 2})]
    parser.flush()
    assert json.loads(parser.calls()[0].arguments) == {"city": 'Paris "X"\n', "days": 2}


def test_reasoning_then_a_call() -> None:
    text = "I need the weather.\n</think>\n\n" + call("get_weather", city="Lyon")
    expected = Final("", "I need the weather.\n", (("get_weather", '{"city": "Lyon"}'),))
    check_all_ways(lambda: build_parser("qwen3_coder", "qwen3", tools=TOOLS,  # type: ignore[arg-type,return-value]
                                        prompt="<|im_start|>assistant\n<think>\n"), text, expected)


@pytest.mark.parametrize(("text", "reasoning", "calls", "real"), [
    ("Call it.\n" + call("get_weather", city="Lyon") + "\n",  # no </think>: the call ends the reasoning
     "Call it.\n", (("get_weather", '{"city": "Lyon"}'),), True),
    ("A <tool_call> mention, then a real one.\n<tool_call>  \n<function=ping>\n</function>\n</tool_call>",
     "A <tool_call> mention, then a real one.\n", (("ping", "{}"),), False),
    ("Ends with a mention: <tool_call>\n", "Ends with a mention: <tool_call>\n", (), False),
])
def test_a_tool_call_ends_unclosed_reasoning(text: str, reasoning: str, calls: tuple[tuple[str, str], ...],
                                             real: bool) -> None:
    check_all_ways(lambda: build_parser("qwen3_coder", "qwen3", tools=TOOLS,  # type: ignore[arg-type,return-value]
                                        prompt="<|im_start|>assistant\n<think>\n"), text,
                   Final("", reasoning, calls), tags_are_real=real)


SEED_CASES = [
    ("one call", "Sure.\n" + call("get_weather", city="Rome", days="2").replace("tool_call>", "seed:tool_call>"),
     "Sure.\n", [("get_weather", {"city": "Rome", "days": 2})]),
    ("a value holding qwen3's end tag", "<seed:tool_call>\n<function=write>\n<parameter=content>\n</tool_call>\n"
     "</parameter>\n</function>\n</seed:tool_call>", "", [("write", {"content": "</tool_call>"})]),
    ("qwen3's tags are text", call("ping"), call("ping"), []),
    ("cut", "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
     "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nRo", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in SEED_CASES], ids=[c[0] for c in SEED_CASES])
def test_seed_oss_is_the_same_grammar_in_seed_tags(text: str, content: str,
                                                   calls: list[tuple[str, dict[str, Any]]]) -> None:
    expected = Final(content, "", tuple((name, args(obj)) for name, obj in calls))
    check_all_ways(lambda: build_parser("seed_oss", None, tools=TOOLS), text, expected,  # type: ignore[arg-type,return-value]
                   tags_are_real=False, seeds=20)


def test_qwen3_xml_is_vllms_other_name_for_qwen3_coder() -> None:
    assert type(build_parser("qwen3_xml", None)) is Qwen3CoderToolParser
    assert isinstance(build_parser("seed_oss", None), SeedOssToolParser)
