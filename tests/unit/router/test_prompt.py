"""The router's prompt ids (services/router/backends/prompt_ids.py) are the frontend's: both are given the same
bodies and must make the same token ids, so that the router's block hashes are the engines'."""
from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.block_hash import block_hashes
from services.frontend.model import Model
from services.frontend.requests.preparer import Preparer
from services.router.backends.prompt_ids import PromptModel, Unrenderable


@pytest.fixture(scope="module")
def models() -> tuple[PromptModel, Preparer]:
    return PromptModel.load("tiny"), Preparer(Model.load("tiny", "tiny"), enable_auto_tool_choice=True,
                                              tool_call_parser="hermes")


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHATS: dict[str, dict[str, Any]] = {
    "one user message": {"messages": [{"role": "user", "content": "Hello there"}]},
    "system, user, assistant, user": {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2 + 2?"}]},
    "content parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                                {"type": "text", "text": "part two"}]}]},
    "tool call and result": {"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3.5}'}], "tools": [TOOL]},
    "tools offered": {"messages": [{"role": "user", "content": "Weather?"}], "tools": [TOOL]},
    "reasoning kept": {"messages": [{"role": "user", "content": "Q"},
                                    {"role": "assistant", "content": "A", "reasoning_content": "thinking"},
                                    {"role": "user", "content": "Q2"}]},
    "no generation prompt": {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
    "continue final message": {"messages": [{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Once upon"}],
                               "add_generation_prompt": False, "continue_final_message": True},
    "thinking off by kwargs": {"messages": [{"role": "user", "content": "Hi"}],
                               "chat_template_kwargs": {"enable_thinking": False}},
    "reasoning effort none": {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none"},
    "special tokens added": {"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True},
    "unicode": {"messages": [{"role": "user", "content": "日本語のテキスト, émigré, 🚀 and \u00a0spaces"}]},
}


@pytest.mark.parametrize("body", CHATS.values(), ids=CHATS.keys())
def test_a_chat_body_gives_the_frontends_ids(models: tuple[PromptModel, Preparer], body: dict[str, Any]) -> None:
    ours, frontend = models
    body = {"model": "tiny", **body}
    expected = frontend.chat(json.dumps(body).encode()).ids.tolist()
    assert ours.prompt_now(body).ids == expected


COMPLETIONS: dict[str, dict[str, Any]] = {
    "text": {"prompt": "The quick brown fox"},
    "text without special tokens": {"prompt": "The quick brown fox", "add_special_tokens": False},
    "token ids": {"prompt": [1, 2, 3, 4]},
    "a batch: its first prompt": {"prompt": ["first prompt", "second one"]},
}


@pytest.mark.parametrize("body", COMPLETIONS.values(), ids=COMPLETIONS.keys())
def test_a_completions_body_gives_the_frontends_ids(models: tuple[PromptModel, Preparer],
                                                    body: dict[str, Any]) -> None:
    ours, frontend = models
    body = {"model": "tiny", **body}
    prompts = frontend.completion(json.dumps(body).encode()).prompts
    assert prompts is not None
    assert ours.prompt_now(body).ids == prompts[0][0].tolist()


def test_truncation_and_salt_are_the_frontends(models: tuple[PromptModel, Preparer]) -> None:
    ours, _ = models
    ids = ours.prompt_now({"prompt": "one two three four five six"}).ids
    assert ours.prompt_now({"prompt": "one two three four five six", "truncate_prompt_tokens": 3}).ids == ids[-3:]
    assert ours.prompt_now({"prompt": "one two three four five six", "truncate_prompt_tokens": 3,
                            "truncation_side": "right"}).ids == ids[:3]
    salted = ours.prompt_now({"prompt": [5] * 32, "cache_salt": "tenant-a"})
    assert salted.salt == "tenant-a"
    assert block_hashes(salted.ids, 16, salt=salted.salt) != block_hashes(salted.ids, 16)


BAD = {
    "an image part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    "an unknown role": {"messages": [{"role": "robot", "content": "beep"}]},
    "tool calls on a user message": {"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
    "empty messages": {"messages": []},
    "both generation prompt and continue": {"messages": [{"role": "user", "content": "x"}],
                                            "continue_final_message": True},
    "an empty prompt": {"prompt": ""},
    "neither": {"input": "x"},
    "truncate to 0": {"prompt": "x", "truncate_prompt_tokens": 0},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_a_body_the_frontend_refuses_gives_no_ids(models: tuple[PromptModel, Preparer], body: dict[str, Any]) -> None:
    with pytest.raises(Unrenderable):
        models[0].prompt_now(body)
