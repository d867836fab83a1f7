"""The deepseek_v3 and deepseek_v31 tool parsers: what a client sees of each model output, however it was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.deepseek_v3 import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

WEATHER = {"city": "Paris", "days": 3}
TRICKY = {"q": "naïve café 日本語 🎉", "nested": {"a": [1, {"b": "}"}, [], {}], "t": True, "n": None},
          "s": f'quote " brace }} bracket ] tags {CALL_END} {CALLS_END} ```', "back": "\\", "x": -1.5e3}


def v3_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args(arguments)}\n```{CALL_END}"


def v31_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{args(arguments)}{CALL_END}"


def section(*calls: str, sep: str = "") -> str:
    return CALLS_BEGIN + sep.join(calls) + CALLS_END


def _cut(call: Any) -> str:
    """A call cut inside a string of its arguments."""
    text = call("f", {"a": "partial"})
    return str(text[:text.index("partial") + 3])


def cases(call: Any) -> list[tuple[str, str, str, tuple[tuple[str, str], ...], bool]]:
    """(id, model output, final content, final calls, tags are real tags), the same for both formats."""
    return [
        ("plain", "Hello, world. a < b and {json} <｜tool", "Hello, world. a < b and {json} <｜tool", (), True),
        ("empty", "", "", (), True),
        ("one call", section(call("get_weather", WEATHER)), "", (("get_weather", args(WEATHER)),), True),
        ("parallel", section(call("f", {"a": 1}), call("g", {"b": [2]}), sep="\n"), "",
         (("f", args({"a": 1})), ("g", args({"b": [2]}))), True),
        ("text then calls", "Let me check.\n\n" + section(call("f", {}), call("g", WEATHER)), "Let me check.\n\n",
         (("f", "{}"), ("g", args(WEATHER))), True),
        ("text after the section", section(call("f", {"a": 1})) + "\n\nDone.", "Done.", (("f", args({"a": 1})),),
         True),
        ("unicode and nested", "Ça va? " + section(call("search", TRICKY)), "Ça va? ",
         (("search", args(TRICKY)),), True),
        ("a second section after text", section(call("f", {})) + "\nThen: " + section(call("g", {"b": 2})), "Then: ",
         (("f", "{}"), ("g", args({"b": 2}))), True),
        ("no section end", CALLS_BEGIN + call("f", {"x": 1}), "", (("f", '{"x": 1}'),), True),
        ("stray text inside the section is dropped", CALLS_BEGIN + " junk " + call("f", {}) + " more " + CALLS_END,
         "", (("f", "{}"),), True),
        ("a call with no section is text", call("f", {"x": 1}), call("f", {"x": 1}), (), False),
        # Cut and malformed outputs.
        ("cut in the section tag", "Hi " + CALLS_BEGIN[:5], "Hi " + CALLS_BEGIN[:5], (), False),
        ("cut in the header", "Hi " + CALLS_BEGIN + call("get_weather", WEATHER)[:20], "Hi ", (), True),
        # A call that is not complete is dropped (its text is control tokens), never sent half-written.
        ("cut in the arguments", "Hi " + CALLS_BEGIN + _cut(call), "Hi ", (), True),
        ("cut in the end tag", CALLS_BEGIN + call("f", {"a": 1})[:-3], "", (("f", args({"a": 1})),), True),
        ("no call end before the next call", CALLS_BEGIN + call("f", {"a": 1}).removesuffix(CALL_END)
         + call("g", {}) + CALLS_END, "", (("f", args({"a": 1})), ("g", "{}")), True),
        ("empty arguments", CALLS_BEGIN + call("f", {}).replace("{}", "") + CALLS_END, "", (("f", "{}"),), True),
        ("arguments that are no JSON", CALLS_BEGIN + call("f", {}).replace("{}", "not json") + CALLS_END, "",
         (), True),
        ("arguments that are no object", CALLS_BEGIN + call("f", {}).replace("{}", "[1]") + CALLS_END, "",
         (), True),
        ("cut before the arguments", CALLS_BEGIN + call("f", {}).split("{}")[0], "", (), True),
        ("unclosed object", CALLS_BEGIN + call("f", {"a": 1}).replace("1}", "1") + CALLS_END + "ok", "ok",
         (), True),
    ]


V3 = cases(v3_call)
V31 = cases(v31_call)


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in V3], ids=[c[0] for c in V3])
def test_deepseek_v3_every_splitting(text: str, content: str, calls: tuple[tuple[str, str], ...], real: bool) -> None:
    assert check_all_ways(DeepSeekV3ToolParser, text, Final(content, "", calls), tags_are_real=real) > len(text)


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in V31], ids=[c[0] for c in V31])
def test_deepseek_v31_every_splitting(text: str, content: str, calls: tuple[tuple[str, str], ...],
                                      real: bool) -> None:
    assert check_all_ways(DeepSeekV31ToolParser, text, Final(content, "", calls), tags_are_real=real) > len(text)


def test_a_v3_header_without_a_separator_drops_the_call() -> None:
    text = section(f"{CALL_BEGIN}get_weather\n```json\n{{}}\n```{CALL_END}", v3_call("g", {}))
    check_all_ways(DeepSeekV3ToolParser, text, Final("", "", (("g", "{}"),)))


def test_complete_arguments_are_the_json_of_the_object() -> None:
    final, _ = drive(DeepSeekV3ToolParser(), [section(v3_call("search", TRICKY))])
    assert json.loads(final.calls[0][1]) == TRICKY


def test_a_call_is_sent_whole_once_its_arguments_are_complete() -> None:
    parser = DeepSeekV31ToolParser()
    assert parser.push("Sure. " + CALLS_BEGIN + CALL_BEGIN).content == "Sure. "
    assert parser.push('f' + SEP + '{"a": "lo').tool_calls == []
    done = parser.push('ng"}' + CALL_END + CALLS_END)
    assert [(d.index, d.name, d.arguments) for d in done.tool_calls] == [(0, "f", '{"a": "long"}')]


def test_reasoning_then_a_call() -> None:
    text = "The user wants the weather.</think>\n\n" + section(v31_call("get_weather", WEATHER))
    expected = Final("", "The user wants the weather.", (("get_weather", args(WEATHER)),))
    check_all_ways(lambda: build_parser("deepseek_v31", "deepseek_r1"), text, expected)  # type: ignore[arg-type,return-value]


def test_the_names_are_vllms_flags() -> None:
    assert isinstance(build_parser("deepseek_v3", None), DeepSeekV3ToolParser)
    assert isinstance(build_parser("deepseek_v31", None), DeepSeekV31ToolParser)
