"""build_parser: the parser a request gets from the --tool-call-parser and --reasoning-parser names."""
from __future__ import annotations

import pytest

from services.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS, build_parser
from services.frontend.parsers.chain import Chain
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.think import ThinkParser


def test_no_names_no_parser() -> None:
    assert build_parser(None, None) is None


def test_one_name_gives_that_parser_alone() -> None:
    assert isinstance(build_parser("hermes", None), HermesToolParser)
    assert isinstance(build_parser(None, "qwen3"), ThinkParser)


def test_both_names_give_a_chain() -> None:
    assert isinstance(build_parser("hermes", "deepseek_r1"), Chain)


def test_names_are_vllms_flags() -> None:
    assert {"hermes", "qwen3_coder", "llama3_json", "llama4_json", "pythonic", "mistral"} <= set(TOOL_PARSERS)
    assert {"qwen3", "deepseek_r1"} <= set(REASONING_PARSERS)


@pytest.mark.parametrize(("tool", "reasoning", "field"), [("nope", None, "tool_call_parser"),
                                                          (None, "nope", "reasoning_parser")])
def test_an_unknown_name_is_refused_naming_the_field(tool: str | None, reasoning: str | None, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: unknown parser 'nope'; expected one of .*hermes|qwen3"):
        build_parser(tool, reasoning)


def test_each_request_gets_its_own_parser() -> None:
    first, second = build_parser("hermes", "qwen3"), build_parser("hermes", "qwen3")
    assert first is not None and second is not None and first is not second
    first.push("<think>x")
    assert second.push("y").content == "y"
