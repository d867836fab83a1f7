"""Translator.chat with tools, tool_choice and tool-call histories: what reaches the engine and the output."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.engine_request import EngineRequest
from services.frontend.requests.translator import Translator
from tests.unit.frontend.test_chat_messages import EXPECTED_QWEN3, ROUND_TRIP, WEATHER


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


def _translator(model: Model, **flags: Any) -> Translator:
    return Translator(model, lambda: 4096, long_prompt_chars=2000, max_concurrent_tokenizations=1, **flags)


@pytest.fixture(scope="module")
def translator(model: Model) -> Iterator[Translator]:
    yield _translator(model)


def _chat(translator: Translator, **body: Any) -> EngineRequest:
    raw = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}).encode()
    return asyncio.run(translator.chat(raw, None))


def _refused(translator: Translator, **body: Any) -> APIError:
    with pytest.raises(APIError) as info:
        _chat(translator, **body)
    assert info.value.status == 400
    return info.value


def test_round_trip_with_tool_choice_none_renders_tools_and_is_carried(translator: Translator,
                                                                       model: Model) -> None:
    req = _chat(translator, messages=ROUND_TRIP, tools=[WEATHER], tool_choice="none", parallel_tool_calls=False)
    assert req.request.prompt_token_ids == model.encode(EXPECTED_QWEN3, add_special_tokens=False)
    assert (req.output.tools, req.output.tool_choice, req.output.parallel_tool_calls) == ((WEATHER,), "none", False)


def test_without_tools_the_options_are_the_defaults(translator: Translator) -> None:
    out = _chat(translator).output
    assert (out.tools, out.tool_choice, out.parallel_tool_calls) == ((), "none", True)
    assert _chat(translator, tool_choice="none").output.tool_choice == "none"
    assert _chat(translator, parallel_tool_calls=None).output.parallel_tool_calls is True


def test_tools_without_tool_choice_mean_auto_which_needs_the_server_flags(translator: Translator,
                                                                          model: Model) -> None:
    err = _refused(translator, tools=[WEATHER])
    assert err.param == "tool_choice"
    assert err.message == '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    enabled = _translator(model, enable_auto_tool_choice=True, tool_call_parser="hermes")
    assert _chat(enabled, tools=[WEATHER]).output.tool_choice == "auto"
    assert _chat(enabled, tools=[WEATHER], tool_choice=None).output.tool_choice == "none"


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "bad name"}}], "tool_choice": "none"},
     "tools[1].function.name"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice.function.name"),
    ({"messages": ROUND_TRIP[:2] + [{"role": "assistant", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": "{oops"}}]}], "tools": [WEATHER], "tool_choice": "none"},
     "messages[2].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "messages[0].role"),
])
def test_refusals_name_the_field(translator: Translator, body: dict[str, Any], param: str) -> None:
    assert _refused(translator, **body).param == param


def test_null_user_content_is_rendered_empty_not_a_template_error(translator: Translator, model: Model) -> None:
    req = _chat(translator, messages=[{"role": "system", "content": None}, {"role": "user"}])
    text = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    assert req.request.prompt_token_ids == model.encode(text, add_special_tokens=False)


def test_the_parsers_of_each_request_and_what_the_detokenizer_keeps_for_them(model: Model) -> None:
    hermes = _translator(model, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    options = _chat(hermes, tools=[WEATHER]).output
    assert (options.tool_parser, options.reasoning_parser, options.skip_special_tokens) == ("hermes", "qwen3", True)
    assert options.prompt_tail.endswith("<|im_start|>assistant\n")
    assert _chat(hermes, tools=[WEATHER], tool_choice="none").output.tool_parser is None
    assert _chat(hermes).output.tool_parser is None  # no tools, nothing to call
    # Qwen3's <tool_call> and <think> are added tokens but not special ones: nothing to keep for them.
    assert {"<tool_call>", "<think>"}.isdisjoint(model.special_tokens) and "<|im_end|>" in model.special_tokens


@pytest.mark.parametrize(("tool_parser", "reasoning_parser", "special"), [
    ("mistral", None, {"[TOOL_CALLS]"}),  # Mistral's tokenizers
    ("kimi_k2", None, {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"}),  # Kimi K2's
    ("glm45", None, {"<tool_call>", "<arg_key>"}),  # GLM-4.5's
    ("hermes", "deepseek_r1", {"<think>"}),  # a reasoning tag marked special
])
def test_a_parsers_tag_that_the_tokenizer_marks_special_is_kept_in_the_text(
        model: Model, tool_parser: str, reasoning_parser: str | None, special: set[str]) -> None:
    marked = replace(model, special_tokens=model.special_tokens | special)
    server = _translator(marked, enable_auto_tool_choice=True, tool_call_parser=tool_parser,
                         reasoning_parser=reasoning_parser)
    assert _chat(server, tools=[WEATHER]).output.skip_special_tokens is False
    # Without a parser that reads those tags the request's own setting holds.
    expect = reasoning_parser is None
    assert _chat(server, tools=[WEATHER], tool_choice="none").output.skip_special_tokens is expect
    assert _chat(server).output.skip_special_tokens is expect
    assert _chat(server, tools=[WEATHER], skip_special_tokens=False).output.skip_special_tokens is False
    # The same parser over a tokenizer where those tags are ordinary text keeps nothing.
    plain = _translator(model, enable_auto_tool_choice=True, tool_call_parser=tool_parser)
    assert _chat(plain, tools=[WEATHER]).output.skip_special_tokens is True


def test_harmony_reads_every_chat_output_and_refuses_stop_strings(model: Model) -> None:
    """gpt-oss: the openai parsers read every chat output by token; stop strings cannot be matched."""
    server = _translator(model, enable_auto_tool_choice=True, tool_call_parser="openai")
    options = _chat(server, tools=[WEATHER]).output
    assert (options.tool_parser, options.reasoning_parser) == ("openai", "openai")
    assert (_chat(server).output.tool_parser, _chat(server).output.reasoning_parser) == (None, "openai")
    err = _refused(server, stop=["\n\n"])
    assert err.param == "stop" and "stop_token_ids" in str(err)
    assert _chat(server, stop=[]).output.stop == ()
    assert _chat(_translator(model, reasoning_parser="openai_gptoss")).output.reasoning_parser == "openai_gptoss"
