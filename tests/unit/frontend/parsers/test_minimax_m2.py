"""The minimax_m2 tool and reasoning parsers, however the output was split."""
from __future__ import annotations

from typing import Any

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.minimax_m2 import MinimaxM2ToolParser, minimax_m2
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "ping"}},
]


def invoke(name: str, **params: str) -> str:
    body = "".join(f'<parameter name="{key}">{value}</parameter>\n' for key, value in params.items())
    return f'<invoke name="{name}">\n{body}</invoke>'


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "\n".join(invokes) + "\n</minimax:tool_call>"


# (id, model output, final content, final calls)
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    ("plain", "Paris is <b>sunny</b>.", "Paris is <b>sunny</b>.", []),
    ("one call", "Sure.\n" + block(invoke("get_weather", city="Paris", days="3")), "Sure.\n",
     [("get_weather", {"city": "Paris", "days": 3})]),
    ("parallel in one block", block(invoke("get_weather", city=" Zürich 東京 "), invoke("ping")), "",
     [("get_weather", {"city": " Zürich 東京 "}), ("ping", {})]),
    ("undescribed parameter: JSON or text", block(invoke("ping", n="[1, 2]", s="x y")), "",
     [("ping", {"n": [1, 2], "s": "x y"})]),
    ("a value without its end tag", block('<invoke name="get_weather">\n<parameter name="city">Rome\n'
                                          '<parameter name="days">2</parameter>\n</invoke>'), "",
     [("get_weather", {"city": "Rome\n", "days": 2})]),
    ("text after", block(invoke("ping")) + "\nDone.", "Done.", [("ping", {})]),
    # Never a call the model did not finish: what is not one is content, as written.
    ("no invoke", "<minimax:tool_call>\nnothing\n</minimax:tool_call>",
     "<minimax:tool_call>\nnothing\n</minimax:tool_call>", []),
    ("cut in a call", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Pa',
     '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Pa', []),
    ("a call, then one cut", '<minimax:tool_call>\n' + invoke("ping") + '\n<invoke name="get_wea',
     '<invoke name="get_wea', [("ping", {})]),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str,
                                               calls: list[tuple[str, dict[str, Any]]]) -> None:
    expected = Final(content, "", tuple((name, args(obj)) for name, obj in calls))
    check_all_ways(lambda: MinimaxM2ToolParser(TOOLS), text, expected, tags_are_real=False, seeds=20)


def test_a_tool_call_ends_the_reasoning() -> None:
    text = "<think>The user wants the weather." + block(invoke("ping"))
    expected = Final("", "The user wants the weather.", (("ping", "{}"),))
    check_all_ways(lambda: build_parser("minimax_m2", "minimax_m2", tools=TOOLS), text, expected,  # type: ignore
                   tags_are_real=False, seeds=20)


def test_the_output_starts_in_reasoning_unless_the_prompt_closed_it() -> None:
    check_all_ways(lambda: minimax_m2(""), "Step 1.</think>Answer.", Final("Answer.", "Step 1.", ()), seeds=10)
    check_all_ways(lambda: minimax_m2("<think>\n</think>\n"), "Answer.", Final("Answer.", "", ()), seeds=10)
