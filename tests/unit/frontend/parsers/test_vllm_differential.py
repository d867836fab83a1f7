"""Our reasoning and tool-call parsers against vLLM's own, on the same model outputs: every family both
ship, over one shared table of outputs and over generated ones. Each output's final message (content,
reasoning, calls' names and parsed arguments) and finish reason must equal vLLM's non-streamed result,
except where DIFFERENCES says otherwise and why; ours streamed (per token, per character) must equal
ours whole, always. vLLM's parsers need only their Python code and a tokenizer: no engine."""
from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.unit.frontend.parsers.vllm_differences import DIFFERENCES, REASONS
from tests.unit.frontend.parsers.vllm_reference import (
    DS_CALLS_END,
    EXTRA_TOKENS,
    KIMI_SECTION_END,
    Result,
    our_results,
    render,
    vllm_result,
)

# family -> (tool parser, reasoning parser): the same names on both sides (our flags are vLLM's).
FAMILIES: dict[str, tuple[str | None, str | None]] = {
    "hermes": ("hermes", None),
    "llama3_json": ("llama3_json", None),
    "llama4_json": ("llama4_json", None),
    "pythonic": ("pythonic", None),
    "mistral": ("mistral", None),
    "qwen3_coder": ("qwen3_coder", None),
    "qwen3_xml": ("qwen3_xml", None),
    "seed_oss": ("seed_oss", None),
    "minimax_m2": ("minimax_m2", None),
    "granite": ("granite", None),
    "phi4_mini_json": ("phi4_mini_json", None),
    "glm45": ("glm45", None),
    "kimi_k2": ("kimi_k2", None),
    "deepseek_v3": ("deepseek_v3", None),
    "deepseek_v31": ("deepseek_v31", None),
    "qwen3+hermes": ("hermes", "qwen3"),
    "qwen3+qwen3_coder": ("qwen3_coder", "qwen3"),
    "glm45+glm45": ("glm45", "glm45"),
    "kimi_k2+kimi_k2": ("kimi_k2", "kimi_k2"),
    "deepseek_r1+deepseek_v3": ("deepseek_v3", "deepseek_r1"),
    "seed_oss+seed_oss": ("seed_oss", "seed_oss"),
    "minimax_m2+minimax_m2": ("minimax_m2", "minimax_m2"),
}
# Not here: gpt-oss's harmony ("openai"): its markers are special tokens of the o200k tokenizer, which
# the suite does not have (tests/unit/frontend/parsers/test_harmony.py covers it by token id).


def _format(family: str) -> str:
    tool = FAMILIES[family][0]
    assert tool is not None
    return tool


WEATHER = ("get_weather", {"city": "Paris", "days": 3})
SEARCH = ("search", {"query": "rain", "filters": {"unit": "C"}})
PING: tuple[str, dict[str, Any]] = ("ping", {})
UNICODE = ("get_weather", {"city": "Zürich 東京 🌧️", "days": 2})
TRICKY = ("search", {"query": 'say "hi" {x} [y] \\ end'})
THINK = "<think>I should check the weather.</think>\n\n"


def _think(fmt: str) -> str:
    return THINK.replace("think>", "seed:think>") if fmt == "seed_oss" else THINK

# The text that closes a family's calls, removed by the "unclosed" rows.
_CLOSER = {"hermes": "\n</tool_call>", "llama3_json": "}", "llama4_json": "}", "pythonic": "]", "mistral": "}",
           "qwen3_coder": "</tool_call>", "qwen3_xml": "</tool_call>",
           "seed_oss": "</seed:tool_call>", "minimax_m2": "</minimax:tool_call>", "glm45": "</tool_call>",
           "kimi_k2": KIMI_SECTION_END, "granite": "]", "phi4_mini_json": "]",
           "deepseek_v3": DS_CALLS_END, "deepseek_v31": DS_CALLS_END}


def _calls(*calls: tuple[str, dict[str, Any]]) -> Callable[[str], str]:
    return lambda fmt: render(fmt, calls)


def _malformed(fmt: str, calls: tuple[tuple[str, dict[str, Any]], ...] = (WEATHER,)) -> str:
    """The weather call written wrong: bad JSON, a value missing, an unclosed value tag."""
    text = render(fmt, calls)
    if fmt == "pythonic":
        return text.replace("days=3", "days=")
    if fmt in ("qwen3_coder", "qwen3_xml", "seed_oss"):
        return text.replace("Paris\n</parameter>", "Paris\n", 1)
    if fmt == "glm45":
        return text.replace("Paris</arg_value>", "Paris", 1)
    if fmt == "minimax_m2":
        return text.replace("Paris</parameter>", "Paris", 1)
    return text.replace('"days": 3}', '"days": 3,}')


def _unclosed(fmt: str) -> str:
    text = render(fmt, [WEATHER])
    closer = _CLOSER[fmt]
    assert text.endswith(closer)
    return text[:-len(closer)]


def _cut(fmt: str, calls: tuple[tuple[str, dict[str, Any]], ...] = (WEATHER,)) -> str:
    """Output that stops inside the weather call's city."""
    text = render(fmt, calls)
    return text[:text.index("Paris") + 2]


@dataclass(frozen=True, slots=True)
class Row:
    text: Callable[[str], str]  # the model's output, given the family's format
    finish: str = "stop"  # why the engine ended it
    reasoning: bool = False  # a row for the families with a reasoning parser only


ROWS: dict[str, Row] = {
    "plain text": Row(lambda fmt: "The weather in Paris is mild."),
    "one call": Row(_calls(WEATHER)),
    "parallel calls": Row(_calls(WEATHER, SEARCH)),
    "no arguments": Row(_calls(PING)),
    "text before": Row(lambda fmt: "Let me check.\n" + render(fmt, [WEATHER])),
    "text after": Row(lambda fmt: render(fmt, [WEATHER]) + "\nI asked for the weather."),
    "unicode": Row(_calls(UNICODE)),
    "quotes and brackets": Row(_calls(TRICKY)),
    "malformed": Row(_malformed),
    "valid then malformed": Row(lambda fmt: _malformed(fmt, (SEARCH, WEATHER))),
    "unclosed": Row(_unclosed),
    "cut, ended normally": Row(_cut),
    "cut by length": Row(_cut, finish="length"),
    "call then cut by length": Row(lambda fmt: _cut(fmt, (SEARCH, WEATHER)), finish="length"),
    "reasoning, no call": Row(lambda fmt: _think(fmt) + "It is mild.", reasoning=True),
    "reasoning then call": Row(lambda fmt: _think(fmt) + render(fmt, [WEATHER]), reasoning=True),
    "reasoning cut by length": Row(lambda fmt: _think(fmt)[:25], finish="length", reasoning=True),
}


def _cases() -> list[tuple[str, str]]:
    return [(family, row) for family, (_, reasoning) in FAMILIES.items() for row, spec in ROWS.items()
            if spec.reasoning <= (reasoning is not None)]


def _text(family: str, row: str) -> str:
    return ROWS[row].text(_format(family))


@pytest.mark.parametrize(("family", "row"), _cases(), ids=[f"{f}-{r}" for f, r in _cases()])
def test_table(family: str, row: str) -> None:
    tool, reasoning = FAMILIES[family]
    text, finish = _text(family, row), ROWS[row].finish
    ours = our_results(tool, reasoning, text, finish)
    assert ours["tokens"] == ours["whole"] and ours["chars"] == ours["whole"], "streamed differs from whole"
    theirs = vllm_result(tool, reasoning, text, finish)
    if (family, row) not in DIFFERENCES:
        assert ours["whole"] == theirs, f"{text!r}"
    else:
        _, expected = DIFFERENCES[family, row]
        assert ours["whole"] == expected, f"{text!r}"
        assert theirs != expected, "vLLM now agrees: the difference is gone, remove its entry"
    _assert_the_rule(ours["whole"], finish)


def _assert_the_rule(result: Result, engine_finish: str) -> None:
    """A call's arguments are a complete JSON object; only output cut by max_tokens may carry partial ones."""
    if engine_finish != "length":
        assert all(isinstance(arguments, dict) for _, arguments in result.calls), result
    if result.calls and engine_finish == "length":
        assert result.finish == "length"


_JSON_ARGUMENT_FAMILIES = ("hermes", "llama3_json", "mistral", "granite", "phi4_mini_json", "kimi_k2", "deepseek_v3",
                           "deepseek_v31")


@pytest.mark.parametrize("literal", ["NaN", "-Infinity", "1e400"])
@pytest.mark.parametrize("family", _JSON_ARGUMENT_FAMILIES)
def test_arguments_holding_what_json_has_not_are_no_call(family: str, literal: str) -> None:
    """Python's json reads NaN and Infinity (and makes 1e400 Infinity), which a strict client's JSON.parse
    throws on: such arguments are not a complete JSON object, so no call is sent (vLLM sends one)."""
    text = render(family, [("get_weather", {"city": "Paris", "days": 12345})]).replace("12345", literal)
    ours = our_results(family, None, text, "stop", splits=("whole", "tokens"))
    assert ours["tokens"] == ours["whole"]
    assert ours["whole"].calls == () and ours["whole"].finish == "stop", (text, ours["whole"])


def test_every_difference_is_a_row_with_a_reason() -> None:
    assert set(DIFFERENCES) <= set(_cases())
    assert {reason for reason, _ in DIFFERENCES.values()} == set(REASONS)


# Generated outputs: calls with arbitrary (schema-conforming) arguments, with and without text before.
# Text the tokenizer round-trips (it normalizes to NFC), with no "<" (the XML-style formats have no escape),
# and none of the marker tokens this harness adds to the tokenizer as special ones ("[ARGS]": vLLM's
# engine drops a special token inside a value, which a real Qwen tokenizer would read as plain text).
# Derandomized: the suite runs the same examples every time (a CI run must not draw a new case).
_STRINGS = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12).filter(
    lambda s: "<" not in s and s == s.strip() and unicodedata.normalize("NFC", s) == s
    and not any(token in s for token in EXTRA_TOKENS))


@st.composite
def _generated_calls(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("get_weather", "search", "ping")))
        if kind == "get_weather":
            arguments = draw(st.fixed_dictionaries({}, optional={"city": _STRINGS.filter(bool),
                                                                  "days": st.integers(-5, 10**6)}))
        elif kind == "search":
            arguments = draw(st.fixed_dictionaries({"query": _STRINGS.filter(bool)}, optional={
                "filters": st.dictionaries(st.sampled_from(("unit", "lang")), _STRINGS, max_size=2)}))
        else:
            arguments = {}
        calls.append((kind, arguments))
    return calls


@pytest.mark.parametrize("family", [f for f, (_, r) in FAMILIES.items() if r is None])
@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=_generated_calls())
def test_generated(family: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    text = render(family, calls)
    # vLLM's phi4_mini_json cuts the array at its first "]" (DIFFERENCES, "phi4_first_bracket").
    assume(family != "phi4_mini_json" or text.count("]") == 1)
    ours = our_results(family, None, text, "stop", splits=("whole", "tokens"))
    assert ours["tokens"] == ours["whole"]
    theirs = vllm_result(family, None, text, "stop")
    assert ours["whole"] == theirs, f"{text!r}"
    assert [(name, json.dumps(a, sort_keys=True)) for name, a in ours["whole"].calls] == [
        (name, json.dumps(a, sort_keys=True)) for name, a in calls]


# The rule on damaged output: generated calls, then the output cut anywhere (stop or length) or a
# character dropped. Every call we send has a JSON object as arguments, streamed equals whole, and
# from cut output every call we send is one the model wrote whole (name and arguments), in order.
_RULE_FAMILIES = [f for f, (_, r) in FAMILIES.items() if r is None]


@pytest.mark.parametrize("family", _RULE_FAMILIES)
@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=_generated_calls(), data=st.data())
def test_damaged_output_never_gives_a_call_the_model_did_not_write(family: str, calls: list[tuple[str, dict[str, Any]]],
                                                                   data: st.DataObject) -> None:
    text = render(family, calls)
    at = data.draw(st.integers(0, len(text) - 1))
    cut = data.draw(st.booleans())
    damaged = text[:at] if cut else text[:at] + text[at + 1:]
    finish = data.draw(st.sampled_from(("stop", "length")))
    ours = our_results(family, None, damaged, finish, splits=("whole", "tokens"))
    assert ours["tokens"] == ours["whole"]
    written = [(name, json.dumps(a, sort_keys=True)) for name, a in calls]
    sent = [(name, json.dumps(a, sort_keys=True)) for name, a in ours["whole"].calls]
    assert all(isinstance(a, dict) for _, a in ours["whole"].calls), f"{damaged!r}"
    position = 0
    for call in sent if cut else ():  # a subsequence of the calls written
        assert call in written[position:], f"{damaged!r}: {call} was not written"
        position = written.index(call, position) + 1
