"""The kimi_k2 tool and reasoning parsers: what a client sees of each model output, however it was split."""
from __future__ import annotations

import json
from typing import Any

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.kimi_k2 import (
    ARGUMENT_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    KimiK2ToolParser,
    kimi_k2,
)
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

BEGIN, END = SECTION_BEGIN[0], SECTION_END[0]
WEATHER = {"city": "Paris", "days": 3}
TRICKY = {"q": "naïve café 日本語 🎉", "nested": {"a": [1, {"b": "}"}, [], {}], "t": True, "n": None},
          "s": f'quote " brace }} bracket ] tags {CALL_END} {END} {CALL_BEGIN}', "back": "\\", "x": -1.5e3}


def call(name: str, arguments: dict[str, Any], index: int = 0, *, prefix: str = "functions.") -> str:
    return f"{CALL_BEGIN}{prefix}{name}:{index}{ARGUMENT_BEGIN}{args(arguments)}{CALL_END}"


def section(*calls: str) -> str:
    return BEGIN + "".join(calls) + END


CUT = call("f", {"a": "partial"})[:call("f", {"a": "partial"}).index("partial") + 3]
# (id, model output, final content, final calls as (id, name, arguments), tags are real tags)
CASES: list[tuple[str, str, str, tuple[tuple[str, str, str], ...], bool]] = [
    ("plain", "Hello, world. a < b and {json} <|tool", "Hello, world. a < b and {json} <|tool", (), True),
    ("empty", "", "", (), True),
    ("one call", section(call("get_weather", WEATHER)), "",
     (("functions.get_weather:0", "get_weather", args(WEATHER)),), True),
    ("parallel", section(call("f", {"a": 1}), "\n", call("g", {"b": [2]}, 1)), "",
     (("functions.f:0", "f", args({"a": 1})), ("functions.g:1", "g", args({"b": [2]}))), True),
    ("text then calls", "Let me check.\n\n" + section(call("f", {}), call("g", WEATHER, 1)), "Let me check.\n\n",
     (("functions.f:0", "f", "{}"), ("functions.g:1", "g", args(WEATHER))), True),
    ("text after the section", section(call("f", {"a": 1})) + "\nDone.", "Done.",
     (("functions.f:0", "f", args({"a": 1})),), True),
    ("unicode and nested", "Ça va? " + section(call("search", TRICKY, 3)), "Ça va? ",
     (("functions.search:3", "search", args(TRICKY)),), True),
    ("singular section tags", SECTION_BEGIN[1] + call("f", {}) + SECTION_END[1] + " ok", "ok",
     (("functions.f:0", "f", "{}"),), True),
    ("an id without the functions prefix", section(call("f", {}, prefix="")), "", (("f:0", "f", "{}"),), True),
    ("spaces around the id and arguments", section(f"{CALL_BEGIN} functions.f:0 {ARGUMENT_BEGIN} {{}} {CALL_END}"),
     "", (("functions.f:0", "f", "{}"),), True),
    ("a header that is no id drops the call", section(f"{CALL_BEGIN}get_weather{ARGUMENT_BEGIN}{{}}{CALL_END}",
                                                      call("g", {}, 1)), "", (("functions.g:1", "g", "{}"),), True),
    ("a repeated id is passed on", section(call("f", {}), call("f", {"a": 1})), "",
     (("functions.f:0", "f", "{}"), ("functions.f:0", "f", args({"a": 1}))), True),
    ("no section end", BEGIN + call("f", {"x": 1}), "", (("functions.f:0", "f", '{"x": 1}'),), True),
    ("a call with no section is text", call("f", {}), call("f", {}), (), False),
    ("cut in the section tag", "Hi " + BEGIN[:9], "Hi " + BEGIN[:9], (), False),
    ("cut in the header", "Hi " + BEGIN + CALL_BEGIN + "functions.get_wea", "Hi ", (), True),
    ("cut in the arguments", "Hi " + BEGIN + CUT, "Hi ", (), True),  # never sent half-written
    ("cut in the end tag", BEGIN + call("f", {"a": 1})[:-4], "", (("functions.f:0", "f", args({"a": 1})),), True),
]


def kimi_id(call_id: str) -> bool:
    return ":" in call_id


@pytest.mark.parametrize(("text", "content", "calls", "real"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str, str], ...],
                                               real: bool) -> None:
    expected = Final(content, "", tuple((name, arguments) for _, name, arguments in calls))
    assert check_all_ways(KimiK2ToolParser, text, expected, tags_are_real=real, id_ok=kimi_id) > len(text)
    parser = KimiK2ToolParser()
    drive(parser, [text], id_ok=kimi_id)
    assert [c.id for c in parser.calls()] == [call_id for call_id, _, _ in calls]


def test_complete_arguments_are_the_json_of_the_object() -> None:
    final, _ = drive(KimiK2ToolParser(), [section(call("search", TRICKY))], id_ok=kimi_id)
    assert json.loads(final.calls[0][1]) == TRICKY


def test_a_call_is_sent_whole_once_its_arguments_are_complete() -> None:
    parser = KimiK2ToolParser()
    assert parser.push("Sure. " + BEGIN + CALL_BEGIN + "functions.f:0").content == "Sure. "
    assert parser.push(ARGUMENT_BEGIN + '{"a": "lo').tool_calls == []
    done = parser.push('ng"}' + CALL_END + END)
    assert [(d.index, d.id, d.name, d.arguments) for d in done.tool_calls] == [
        (0, "functions.f:0", "f", '{"a": "long"}')]


PLAIN = "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
NO_THINKING = PLAIN + "<think></think>"
# (id, prompt, model output, final reasoning, final content, tags are real tags)
REASONING = [
    ("think then answer", PLAIN, "<think>Step 1.</think>The answer.", "Step 1.", "The answer.", True),
    ("starts in reasoning without think", PLAIN, "Step 1.</think>\n\nThe answer.", "Step 1.", "The answer.", True),
    ("never closed is all reasoning", PLAIN, "<think>still thinking", "still thinking", "", True),
    ("empty", PLAIN, "", "", "", True),
    ("unicode", PLAIN, "日本語 🎉</think>Ça", "日本語 🎉", "Ça", True),
    ("a tool section ends the reasoning", PLAIN, "<think>I will call f." + section(call("f", {})),
     "I will call f.", section(call("f", {})), False),
    ("thinking switched off", NO_THINKING, "Just an answer.", "", "Just an answer.", True),
    ("cut in the end tag", PLAIN, "abc</thi", "abc</thi", "", False),
]


@pytest.mark.parametrize(("prompt", "text", "reasoning", "content", "real"), [c[1:] for c in REASONING],
                         ids=[c[0] for c in REASONING])
def test_reasoning_every_splitting(prompt: str, text: str, reasoning: str, content: str, real: bool) -> None:
    check_all_ways(lambda: kimi_k2(prompt), text, Final(content, reasoning, ()), tags_are_real=real)


def test_reasoning_then_calls_without_closing_it() -> None:
    text = "<think>The user wants the weather." + section(call("get_weather", WEATHER)) + "\nDone."
    expected = Final("Done.", "The user wants the weather.", (("get_weather", args(WEATHER)),))
    check_all_ways(lambda: build_parser("kimi_k2", "kimi_k2", prompt=PLAIN), text, expected,  # type: ignore
                   id_ok=kimi_id)


def test_the_names_are_vllms_flags() -> None:
    assert isinstance(build_parser("kimi_k2", None), KimiK2ToolParser)
    assert build_parser(None, "kimi_k2") is not None
