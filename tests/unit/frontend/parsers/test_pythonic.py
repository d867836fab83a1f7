"""The pythonic tool parser: a leading Python list of calls, however the output was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers.pythonic import PythonicToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

# (id, model output, final content, final calls as (name, arguments object))
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    ("plain", "Paris is sunny (mostly).", "Paris is sunny (mostly).", []),
    ("empty", "", "", []),
    ("a list that is no call", "[1] See the reference.", "[1] See the reference.", []),
    ("a link", "[the docs](https://example.com)", "[the docs](https://example.com)", []),
    ("empty list", "[]", "[]", []),
    ("one call", '[get_weather(city="Paris", days=3)]', "", [("get_weather", {"city": "Paris", "days": 3})]),
    ("no arguments", "[ping()]", "", [("ping", {})]),
    ("parallel", "[f(a=1), g(b='x'),\n h(c=None, d=True, e=-2.5)]", "",
     [("f", {"a": 1}), ("g", {"b": "x"}), ("h", {"c": None, "d": True, "e": -2.5})]),
    ("nested and tricky strings", "[search(q='naïve 日本語 🎉, \"quoted\" ) ] \\' done', "
     "opts={'a': [1, (2, 3)], 'b': {'c': 'x)y'}}, tags=[])]", "",
     [("search", {"q": "naïve 日本語 🎉, \"quoted\" ) ] ' done", "opts": {"a": [1, [2, 3]], "b": {"c": "x)y"}},
                  "tags": []})]),
    ("trailing comma", "[f(a=1,)]", "", [("f", {"a": 1})]),
    ("leading whitespace, text after", "\n[f(a=1)]\n\nDone.", "Done.", [("f", {"a": 1})]),
    ("JSON names", "[f(a=null, b=true, c=false, d=-1)]", "", [("f", {"a": None, "b": True, "c": False, "d": -1})]),
    # Arguments that would not match what the model wrote (vLLM drops a positional one, keeps the last
    # of a repeated keyword) are content: the rule is the call as written or none.
    ("a positional argument", "[f(1, b=2)]", "[f(1, b=2)]", []),
    ("a keyword repeated", "[f(a=1, a=2)]", "[f(a=1, a=2)]", []),
    # What is not a complete list of calls with literal values is content, all of it, as in vLLM: never
    # a call the model did not finish, or one with a value dropped.
    ("a value that is no literal", "[f(a=x + 1, b=2)]", "[f(a=x + 1, b=2)]", []),
    ("a value missing", '[f(city="Paris", days=)]', '[f(city="Paris", days=)]', []),
    ("the list never closed", '[f(city="Paris", days=3)', '[f(city="Paris", days=3)', []),
    ("cut before the call", "[get_wea", "[get_wea", []),
    ("cut in a value", "[f(a=1, b='hal", "[f(a=1, b='hal", []),
    ("cut in an escape", "[f(a='x\\", "[f(a='x\\", []),
    ("cut between calls", "[f(a=1), g", "[f(a=1), g", []),
    ("the list broken after a call", "[f(a=1), 5]", "[f(a=1), 5]", []),
    ("a closer that closes nothing", "[f(a=1)) and more", "[f(a=1)) and more", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str,
                                               calls: list[tuple[str, dict[str, Any]]]) -> None:
    expected = Final(content, "", tuple((name, args(obj)) for name, obj in calls))
    check_all_ways(PythonicToolParser, text, expected)
    final, _ = drive(PythonicToolParser(), [text])
    assert [(name, json.loads(arguments)) for name, arguments in final.calls] == calls


def test_the_calls_are_sent_when_the_list_closes() -> None:
    parser = PythonicToolParser()
    assert parser.push('[get_weather(city="Par').tool_calls == []
    assert parser.push('is", days=3), ping(').tool_calls == []
    done = parser.push(")]")
    assert [(d.index, d.name, d.arguments) for d in done.tool_calls] == [
        (0, "get_weather", '{"city": "Paris", "days": 3}'), (1, "ping", "{}")]


def test_text_that_stops_looking_like_calls_is_released_at_once() -> None:
    parser = PythonicToolParser()
    assert parser.push("[").content == ""
    assert parser.push("Note: ").content == "[Note: "
