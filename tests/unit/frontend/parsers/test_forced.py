"""Forced tool_choice parsers: a named function's arguments streamed as they come, "required"'s array
of calls streamed as it is read, however the output was split; cut or malformed output as content."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers import ParsedDelta
from services.frontend.parsers.forced import NamedToolParser, RequiredToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

ARGS = '{"city":"Paris","days":3}'
WEATHER = {"city": "Paris", "days": 3}
TRICKY = {"q": "naïve café 日本語 🎉", "nested": {"a": [1, {"b": "}"}, [], {}], "t": True, "n": None},
          "s": 'quote " brace } bracket ] [ { \\ / \t\n', "back": "\\", "x": -1.5e3}


def item(name: str, parameters: dict[str, Any]) -> str:
    return f'{{"name": {json.dumps(name)}, "parameters": {args(parameters)}}}'


def array(*items: str) -> str:
    return "[" + ", ".join(items) + "]"


SPACED = ('[\n  {\n    "name" :\t"f" ,\n    "parameters" :\r\n { "a" : [ 1 , 2 ] ,\n "b" : { } }\n  }\n ,\n'
          '{"name":"g","parameters":{}}  ]\n\n')
ESCAPED = json.dumps(TRICKY)  # ensure_ascii: unicode written as \\u escapes, kept as written
# (id, model output, final content, final calls)
CASES = [
    ("one call", array(item("get_weather", WEATHER)), "", (("get_weather", args(WEATHER)),)),
    ("compact", '[{"name":"a","parameters":{"x":"é"}},{"name":"b","parameters":{}}]', "",
     (("a", '{"x":"é"}'), ("b", "{}"))),
    ("parallel", array(item("f", {"a": 1}), item("g", {"b": [2]}), item("f", {})), "",
     (("f", '{"a": 1}'), ("g", '{"b": [2]}'), ("f", "{}"))),
    ("unicode, escapes and nesting", array(item("search", TRICKY)), "", (("search", args(TRICKY)),)),
    ("unicode as escapes", f'[{{"name": "search", "parameters": {ESCAPED}}}]', "", (("search", ESCAPED),)),
    ("keys reversed", '[{"parameters": {"a": "}", "b": {"c": []}}, "name": "f"}]', "",
     (("f", '{"a": "}", "b": {"c": []}}'),)),
    ("keys reversed after a call", array(item("f", {}), '{"parameters": {"x": "é"}, "name": "g"}'), "",
     (("f", "{}"), ("g", '{"x": "é"}'))),
    ("escaped keys and name", '[{"\\u006eame": "f\\u005f1", "param\\u0065ters": {"a": 1}}]', "",
     (("f_1", '{"a": 1}'),)),
    ("whitespace everywhere JSON allows", SPACED, "",
     (("f", '{ "a" : [ 1 , 2 ] ,\n "b" : { } }'), ("g", "{}"))),
    ("leading whitespace", "\n\n " + array(item("f", {"a": 1})), "", (("f", '{"a": 1}'),)),
    ("an empty array", "[ ]", "", ()),
    ("text after the array is content", array(item("f", {})) + "\n Done.", "Done.", (("f", "{}"),)),
    # Cut by max_tokens: a sent call keeps what was streamed; anything not sent is content.
    ("cut before the first call's parameters", '[{"name":"a","param', '[{"name":"a","param', ()),
    ("cut in the first name", '\n[ {"name": "get_wea', '\n[ {"name": "get_wea', ()),
    ("cut in the parameters", '[{"name": "a", "parameters": {"x": "par', "", (("a", '{"x": "par'),)),
    ("cut after the parameters", '[{"name": "a", "parameters": {"x": 1}', "", (("a", '{"x": 1}'),)),
    ("cut in a sent call's framing", '[{"name": "a", "parameters": {"x": 1}, "na', "", (("a", '{"x": 1}'),)),
    ("cut before the closing bracket", array(item("a", {}), item("b", {}))[:-1] + "\n", "",
     (("a", "{}"), ("b", "{}"))),
    ("cut in the second call's name", array(item("a", {}))[:-1] + ', {"name": "b', '{"name": "b',
     (("a", "{}"),)),
    ("cut in reversed parameters", '[{"parameters": {"x": 1}, "na', '[{"parameters": {"x": 1}, "na', ()),
    ("cut after reversed parameters, not the first",
     array(item("a", {}))[:-1] + ',{"parameters": {"x": 1}}', '{"parameters": {"x": 1}}', (("a", "{}"),)),
    ("empty output", "", "", ()),
    ("only whitespace", " \n", " \n", ()),
    # Not the shape structured output guarantees (a sim engine, say): content, never an error.
    ("plain text", "Hello, world. [a] {b}", "Hello, world. [a] {b}", ()),
    ("an object, not an array", item("f", {}), item("f", {}), ()),
    ("an item that is no call", '[{"foo": 1}]', '[{"foo": 1}]', ()),
    ("a name that is an object", '[{"parameters": {}, "name": {"a": 1}}]', '[{"parameters": {}, "name": {"a": 1}}]',
     ()),
    ("a name that is no string", '[{"name": 5, "parameters": {}}]', '[{"name": 5, "parameters": {}}]', ()),
    ("parameters that are no object", '[{"name": "f", "parameters": "x"}]', '[{"name": "f", "parameters": "x"}]',
     ()),
    ("a call without parameters", array(item("a", {}))[:-1] + ', {"name": "b"}]', '{"name": "b"}]',
     (("a", "{}"),)),
    ("a key said twice", '[{"parameters": {}, "parameters": {}, "name": "f"}]',
     '[{"parameters": {}, "parameters": {}, "name": "f"}]', ()),
    ("an extra key after a sent call's parameters", '[{"name": "f", "parameters": {"a": 1}, "x": 2}]',
     '"x": 2}]', (("f", '{"a": 1}'),)),
    ("a bad escape in a name", '[{"name": "f\\q", "parameters": {}}]', '[{"name": "f\\q", "parameters": {}}]', ()),
    ("a trailing comma", array(item("a", {}))[:-1] + ",]", "]", (("a", "{}"),)),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_required_gives_the_same_result_however_it_was_split(text: str, content: str,
                                                            calls: tuple[tuple[str, str], ...]) -> None:
    assert check_all_ways(RequiredToolParser, text, Final(content, "", calls)) > len(text)


@pytest.mark.parametrize("obj", [WEATHER, TRICKY, {}, {"a": {"b": {"c": [[], [{}]]}}}])
def test_required_arguments_are_the_json_of_the_parameters_object(obj: dict[str, Any]) -> None:
    final, _ = drive(RequiredToolParser(), list(array(item("f", obj), item("g", obj))))
    assert [(name, json.loads(arguments)) for name, arguments in final.calls] == [("f", obj), ("g", obj)]


def test_required_sends_a_call_once_its_name_is_complete_and_its_parameters_begin() -> None:
    parser = RequiredToolParser()
    assert parser.push('[{"name": "get_wea').tool_calls == []
    assert parser.push('ther", "parameters":').tool_calls == []
    first = parser.push(' {"city": "Pa')
    assert [(d.index, d.name, d.arguments) for d in first.tool_calls] == [(0, "get_weather", '{"city": "Pa')]
    assert first.tool_calls[0].id is not None and first.tool_calls[0].id.startswith("call_")
    more = parser.push('ris"}}, {"name": "f", "parameters": {')
    assert [(d.index, d.id, d.name, d.arguments) for d in more.tool_calls][0] == (0, None, None, 'ris"}')
    assert [(d.index, d.name, d.arguments) for d in more.tool_calls][1] == (1, "f", "{")
    assert [(d.index, d.id, d.arguments) for d in parser.push("}}]").tool_calls] == [(1, None, "}")]
    assert parser.flush().tool_calls == []
    assert [(c.name, c.arguments) for c in parser.calls()] == [("get_weather", '{"city": "Paris"}'), ("f", "{}")]
    assert len({c.id for c in parser.calls()}) == 2 and first.tool_calls[0].id == parser.calls()[0].id


def test_required_holds_parameters_written_before_the_name_until_it_comes() -> None:
    parser = RequiredToolParser()
    assert parser.push('[{"parameters": {"a": [1, "}"]}, ').tool_calls == []
    assert parser.push('"name": "').tool_calls == []
    [call] = parser.push('f"}]').tool_calls
    assert (call.index, call.name, call.arguments) == (0, "f", '{"a": [1, "}"]}')


def test_required_output_cut_short_is_content_as_written() -> None:
    parser = RequiredToolParser()
    assert parser.push('[{"name":"a","param') == ParsedDelta()
    assert parser.flush() == ParsedDelta(content='[{"name":"a","param') and parser.calls() == []
    named = NamedToolParser("f")
    assert named.flush().tool_calls == [] and named.calls() == []


def test_a_named_call_streams_its_arguments_with_id_and_name_first() -> None:
    parser = NamedToolParser("get_weather")
    deltas = [parser.push(piece) for piece in (ARGS[:5], ARGS[5:11], ARGS[11:])] + [parser.flush()]
    first = deltas[0].tool_calls[0]
    assert (first.index, first.name, first.id and first.id.startswith("call_")) == (0, "get_weather", True)
    assert all(d.tool_calls[0].id is None and d.tool_calls[0].name is None for d in deltas[1:3])
    assert "".join(c.arguments for d in deltas for c in d.tool_calls) == ARGS
    [call] = parser.calls()
    assert (call.id, call.name, call.arguments) == (first.id, "get_weather", ARGS)
    assert all(d.content == "" and d.reasoning == "" for d in deltas)
