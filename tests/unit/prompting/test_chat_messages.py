"""prompting/chat_messages.py on decoded JSON as the router hands it (the frontend's path, through its schema,
is tests/unit/frontend/test_chat_messages.py): every shape it cannot take is a PromptError naming the field."""
from __future__ import annotations

from typing import Any

import pytest

from prompting.chat_messages import template_kwargs, template_messages
from prompting.errors import PromptError
from prompting.truncation import truncated


@pytest.mark.parametrize(("messages", "param"), [
    (["not an object"], "messages[0]"),
    ([{"content": "no role"}], "messages[0].role"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": ["text"]}], "messages[0].content[0]"),
    ([{"role": "assistant", "tool_calls": {"id": "x"}}], "messages[0].tool_calls"),
    ([{"role": "assistant", "tool_calls": ["call"]}], "messages[0].tool_calls[0]"),
    ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
])
def test_a_shape_it_cannot_take_names_the_field(messages: list[Any], param: str) -> None:
    with pytest.raises(PromptError) as info:
        template_messages(messages)
    assert info.value.param == param and str(info.value).startswith(param)


def test_the_templates_dicts() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert template_messages([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "n"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "r"},
        {"role": "assistant", "content": "x", "tool_calls": []},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
    ]) == [
        {"role": "user", "content": "a\nb", "name": "n"},
        {"role": "assistant", "content": "", "reasoning_content": "r",
         "tool_calls": [{**call, "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "assistant", "content": "x"},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
    ]


def test_template_kwargs() -> None:
    assert template_kwargs(None) is None
    assert template_kwargs({"x": 1}) == {"x": 1}
    assert template_kwargs(None, reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert template_kwargs({"enable_thinking": False}, reasoning_effort="high", documents=[{"t": "d"}]) == \
        {"enable_thinking": False, "reasoning_effort": "high", "documents": [{"t": "d"}]}
    with pytest.raises(PromptError) as info:
        template_kwargs([])
    assert info.value.param == "chat_template_kwargs"


def test_truncation() -> None:
    ids = [1, 2, 3, 4, 5]
    assert truncated(ids, None, None, 8) is ids
    assert truncated(ids, 2, None, 8) == [4, 5] and truncated(ids, 2, "right", 8) == [1, 2]
    assert truncated(ids, -1, "left", 4) == [3, 4, 5]  # room for one generated token
    assert truncated(ids, 9, None, None) is ids  # the limit not known: only -1 needs it
    for keep, limit in ((0, 8), (-2, 8), (9, 8), (-1, None), (True, 8)):
        with pytest.raises(PromptError) as info:
            truncated(ids, keep, None, limit)  # type: ignore[arg-type]
        assert info.value.param == "truncate_prompt_tokens"
