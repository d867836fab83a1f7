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
    ("cut in a call", '<|tool_call|>[{"name": "get_weather", "arguments": {"ci',
     '{"name": "get_weather", "arguments": {"ci', ()),
    ("malformed", '<|tool_call|>[{"name": "f", "arguments": {"a": 1,}}]', '{"name": "f", "arguments": {"a": 1,}}]', ()),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str], ...]) -> None:
    check_all_ways(GraniteToolParser, text, Final(content, "", calls), tags_are_real=False, seeds=20)


def test_the_name_is_vllms_flag() -> None:
    assert isinstance(build_parser("granite", None), GraniteToolParser)
