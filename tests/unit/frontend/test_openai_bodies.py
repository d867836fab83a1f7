"""openai_bodies: chat bodies and chunks carrying reasoning and tool calls, read back by the openai SDK's types."""
from __future__ import annotations

import json

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.frontend.generation.output import usage_body
from services.frontend.http_api import openai_bodies
from services.frontend.parsers import ParsedDelta, ToolCall, ToolCallDelta

USE = usage_body(3, 4)


def _chunk(event: bytes) -> ChatCompletionChunk:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return ChatCompletionChunk.model_validate_json(event[6:-2])


def test_a_body_without_a_parser_has_no_reasoning_or_tool_call_fields() -> None:
    body = json.loads(openai_bodies.chat_completion("c1", "m", "hi", "stop", None, USE))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}


def test_tool_calls_alone_have_null_content_and_the_calls_in_order() -> None:
    calls = [ToolCall("call_a", "f", '{"x": 1}'), ToolCall("call_b", "g", "{}")]
    raw = openai_bodies.chat_completion("c1", "m", "", "tool_calls", None, USE, reasoning="why", tool_calls=calls)
    message = ChatCompletion.model_validate_json(raw).choices[0].message
    assert message.content is None
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("call_a", "function", "f", '{"x": 1}'), ("call_b", "function", "g", "{}")]
    body = json.loads(raw)["choices"][0]["message"]
    assert body["reasoning_content"] == body["reasoning"] == "why"


def test_a_parser_that_found_nothing_answers_empty_calls_and_null_reasoning() -> None:
    body = json.loads(openai_bodies.chat_completion("c1", "m", "hi", "stop", None, USE, reasoning="", tool_calls=[]))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi", "reasoning_content": None,
                                             "reasoning": None, "tool_calls": []}


def test_delta_chunks_carry_reasoning_content_and_tool_call_fragments() -> None:
    writer = openai_bodies.ChunkWriter("c1", "m", chat=True)
    first = _chunk(writer.delta(ParsedDelta("", "think", [ToolCallDelta(0, "call_a", "f", "")])))
    later = _chunk(writer.delta(ParsedDelta("ok", "", [ToolCallDelta(0, None, None, '{"x"')]), USE))
    delta = first.choices[0].delta
    assert delta.content is None and delta.model_extra == {"reasoning_content": "think", "reasoning": "think"}
    call = (delta.tool_calls or [])[0]
    assert (call.index, call.id, call.type, call.function and call.function.name) == (0, "call_a", "function", "f")
    delta = later.choices[0].delta
    call = (delta.tool_calls or [])[0]
    assert delta.content == "ok" and (call.index, call.id, call.function and call.function.arguments) == (
        0, None, '{"x"')
    assert call.function is not None and call.function.name is None
    assert later.usage is not None and later.usage.completion_tokens == 4


def test_the_prebuilt_reasoning_and_argument_chunks_read_as_the_general_ones() -> None:
    writer = openai_bodies.ChunkWriter("c1", "m", chat=True)
    cases = [(ParsedDelta("", 'a "quoted" thought\n'), {"reasoning_content": 'a "quoted" thought\n',
                                                        "reasoning": 'a "quoted" thought\n'}),
             (ParsedDelta("", "", [ToolCallDelta(3, None, None, '{"é": "}')]),
              {"tool_calls": [{"index": 3, "function": {"arguments": '{"é": "}'}}]})]
    for parsed, delta in cases:
        fast = json.loads(writer.delta(parsed)[6:])
        assert fast["choices"] == [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        assert {k: fast[k] for k in ("id", "object", "model")} == {"id": "c1", "object": "chat.completion.chunk",
                                                                  "model": "m"}
        assert _chunk(writer.delta(parsed)).choices[0].delta.model_dump(exclude_none=True) != {}
