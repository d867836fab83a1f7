"""The granite tool parser: a JSON array of calls after <|tool_call|> or <tool_call>, however the output was split."""
from __future__ import annotations

import pytest

from services.frontend.parsers import build_parser
from services.frontend.parsers.granite import GraniteToolParser
from tests.unit.frontend.parsers.harness import Final, check_all_ways

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# (id, model output, final content, final calls)
CASES = [
    ("plain", "Granite <3 [1, 2].", "Granite <3 [1, 2].", ()),
    ("3.0 marker", "<|tool_call|>[" + CALL + "]", "", (("get_weather", '{"city": "Paris"}'),)),
    ("3.1 marker, text around", "Sure. <tool_call> [" + CALL + ', {"name": "ping", "arguments": {}}]\nDone.',
     "Sure. Done.", (("get_weather", '{"city": "Paris"}'), ("ping", "{}"))),
    ("a marker without an array", "<tool_call> no calls", "<tool_call> no calls", ()),
    # Never a call the model did not finish: with no call before it, all of it is text, as written.
    ("cut in a call", '<|tool_call|>[{"name": "get_weather", "arguments": {"ci',
     '<|tool_call|>[{"name": "get_weather", "arguments": {"ci', ()),
    ("malformed", '<|tool_call|>[{"name": "f", "arguments": {"a": 1,}}]',
     '<|tool_call|>[{"name": "f", "arguments": {"a": 1,}}]', ()),
    ("a call, then one cut", '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "argu',
     '{"name": "g", "argu', (("f", "{}"),)),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str], ...]) -> None:
    check_all_ways(GraniteToolParser, text, Final(content, "", calls), tags_are_real=False, seeds=20)


def test_the_name_is_vllms_flag() -> None:
    assert isinstance(build_parser("granite", None), GraniteToolParser)


PHI4 = [
    ("text, then calls", 'Sure.\nfunctools[{"name": "f", "arguments": {"q": "[x]"}}, {"name": "g", "parameters": {}}]',
     "Sure.\n", (("f", '{"q": "[x]"}'), ("g", "{}"))),
    ("cut: all text", 'functools[{"name": "f", "arguments": {"q": "x',
     'functools[{"name": "f", "arguments": {"q": "x', ()),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in PHI4], ids=[c[0] for c in PHI4])
def test_phi4_mini_json_is_the_same_array_after_functools(text: str, content: str,
                                                         calls: tuple[tuple[str, str], ...]) -> None:
    check_all_ways(lambda: build_parser("phi4_mini_json", None), text, Final(content, "", calls),  # type: ignore
                   tags_are_real=False, seeds=20)
