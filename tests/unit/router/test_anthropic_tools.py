"""Anthropic Messages codec, tools and thinking: client tools and tool_use/tool_result both ways,
thinking blocks, and what the official anthropic SDK makes of them, streamed (its event types and
MessageStream accumulator) and not."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

from services.router.listeners.codecs.anthropic import MessagesStream, chat_to_message, tool_input
from services.router.listeners.codecs.anthropic_request import messages_to_chat
from tests.support.sdk_mock import sse_events, sse_http

MODEL = "qwen-test"
HI = [{"role": "user", "content": "weather in Paris?"}]
WEATHER = {"name": "weather", "description": "The weather in a city", "cache_control": {"type": "ephemeral"},
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "custom", "name": "time", "input_schema": {"type": "object", "properties": {}}}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
THINK = {"model": MODEL, "thinking": {"type": "enabled", "budget_tokens": 1024}}


def answer(content: str | None, reasoning: str | None = None, calls: tuple[tuple[str, str, str], ...] = (),
           finish: str = "tool_calls", field: str = "reasoning_content") -> dict[str, Any]:
    """A non-streamed chat completion as vLLM answers with a reasoning and a tool parser."""
    message: dict[str, Any] = {"role": "assistant", "content": content, field: reasoning,
                               "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                              for i, n, a in calls]}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call_start(index: int, call_id: str, name: str, arguments: str = "") -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}}]})


def call_args(index: int, fragment: str) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


USAGE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": [],
         "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}}
FULL_STREAM = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Weather, "}),
               chunk({"reasoning_content": "then time."}), chunk({"content": "Let me check."}),
               call_start(0, "call_a", "weather"), call_args(0, '{"city": '), call_args(0, '"Paris"}'),
               call_start(1, "call_b", "time", "{"), call_args(1, "}"), chunk({}, "tool_calls"), USAGE]
FULL_ANSWER = answer("Let me check.", "Weather, then time.",
                     (("call_a", "weather", '{"city": "Paris"}'), ("call_b", "time", "{}")))


def serve_chunks(chunks: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Iterator[bytes]]:
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        messages_to_chat(body)
        stream = MessagesStream(body)
        yield stream.start(None)
        for piece in chunks:
            yield stream.feed(piece)
        yield stream.finish()
    return serve


def client(serve: Callable[[dict[str, Any]], Iterator[bytes]], raw: list[bytes] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url="http://router.test", http_client=sse_http(serve, raw),
                               max_retries=0)


def without_id(message: Message) -> dict[str, Any]:
    body = message.model_dump(exclude_none=True)
    body.pop("id")
    return body


# request translation


def test_tools_and_tool_choice_go_up_in_chat_shape() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 64, "messages": HI, "tools": [WEATHER, TIME],
                             "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}})
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": WEATHER["input_schema"]}},
        {"type": "function", "function": {"name": "time", "parameters": TIME["input_schema"]}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(("kind", "expected"), [("auto", "auto"), ("any", "required"), ("none", "none")])
def test_tool_choice_types(kind: str, expected: str) -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 8, "messages": HI, "tools": [TIME],
                             "tool_choice": {"type": kind}})
    assert chat["tool_choice"] == expected and "parallel_tool_calls" not in chat


def test_no_tools_sends_no_tool_fields() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 8, "messages": HI, "tools": [],
                             "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}})
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & chat.keys()


@pytest.mark.parametrize(("thinking", "enabled"), [({"type": "enabled", "budget_tokens": 2048}, True),
                                                   ({"type": "disabled"}, False)])
def test_thinking_switches_the_chat_template(thinking: dict[str, Any], enabled: bool) -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 4096, "messages": HI, "thinking": thinking})
    assert chat["chat_template_kwargs"] == {"enable_thinking": enabled}
    assert "chat_template_kwargs" not in messages_to_chat({"model": MODEL, "max_tokens": 8, "messages": HI})


def test_a_tool_loop_becomes_assistant_tool_calls_and_tool_messages() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 64, "tools": [WEATHER, TIME], "messages": [
        *HI,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two tools.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_b", "name": "time", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "is_error": True,
             "content": [{"type": "text", "text": "clock "}, {"type": "text", "text": "broken"}]},
            {"type": "text", "text": "and tomorrow?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_c", "name": "time", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_c"}]}]})
    assert chat["messages"] == [
        *HI,
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "reasoning_content": "Two tools.",
         "tool_calls": [
             {"id": "toolu_a", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
             {"id": "toolu_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_b",
         "content": [{"type": "text", "text": "Error: "}, {"type": "text", "text": "clock "},
                     {"type": "text", "text": "broken"}]},
        {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "toolu_c", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_c", "content": ""}]
    assert "continue_final_message" not in chat


def test_an_error_result_given_as_a_string_is_led_by_error() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "404",
                                      "is_error": True}]}]})
    assert chat["messages"] == [{"role": "tool", "tool_call_id": "t", "content": "Error: 404"}]


# non-streamed


def test_thinking_text_and_tool_use_blocks_in_that_order() -> None:
    message = Message.model_validate(chat_to_message(FULL_ANSWER, THINK))
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, weather, time = message.content
    assert thinking.type == "thinking" and (thinking.thinking, thinking.signature) == ("Weather, then time.", "")
    assert text.type == "text" and text.text == "Let me check."
    assert weather.type == "tool_use" and (weather.id, weather.name, weather.input) == (
        "call_a", "weather", {"city": "Paris"})
    assert time.type == "tool_use" and (time.id, time.name, time.input) == ("call_b", "time", {})
    assert message.stop_reason == "tool_use"


def test_tool_use_alone_and_reasoning_under_its_newer_name() -> None:
    message = Message.model_validate(chat_to_message(
        answer(None, "hm", (("call_a", "weather", '{"city": "Oslo"}'),), field="reasoning"), THINK))
    assert [block.type for block in message.content] == ["thinking", "tool_use"]


def test_reasoning_the_client_did_not_enable_is_not_answered() -> None:
    for request in ({"model": MODEL}, {"model": MODEL, "thinking": {"type": "disabled"}}):
        message = Message.model_validate(chat_to_message(FULL_ANSWER, request))
        assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    with client(serve_chunks(FULL_STREAM)).messages.stream(model=MODEL, max_tokens=64, messages=HI) as stream:
        final = stream.get_final_message()
    assert without_id(final) == without_id(Message.model_validate(chat_to_message(FULL_ANSWER, {"model": MODEL})))


@pytest.mark.parametrize(("arguments", "expected"), [
    ('{"city": "Oslo"}', {"city": "Oslo"}),
    ("", {}),
    ('{"city": "Os', {"_raw_arguments": '{"city": "Os'}),  # cut off or malformed: kept whole
    ("[1, 2]", {"_raw_arguments": "[1, 2]"}),  # JSON, but no object
])
def test_tool_input_from_arguments(arguments: str, expected: dict[str, Any]) -> None:
    assert tool_input(arguments) == expected
    message = Message.model_validate(chat_to_message(answer(None, None, (("c", "weather", arguments),)),
                                                     {"model": MODEL}))
    assert message.content[0].type == "tool_use" and message.content[0].input == expected


def test_the_sdk_sends_tools_the_adapter_reads() -> None:
    seen: list[dict[str, Any]] = []

    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        seen.append(messages_to_chat(body))
        yield from serve_chunks(FULL_STREAM)(body)
    with client(serve).messages.stream(model=MODEL, max_tokens=4096, messages=HI, tools=[WEATHER, TIME],
                                       tool_choice={"type": "any"},
                                       thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        stream.until_done()
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["weather", "time"]
    assert seen[0]["tool_choice"] == "required" and seen[0]["chat_template_kwargs"] == {"enable_thinking": True}


# streams


def test_a_streamed_tool_turn_accumulates_in_the_sdk_to_the_non_streamed_message() -> None:
    raw: list[bytes] = []
    with client(serve_chunks(FULL_STREAM), raw).messages.stream(model=MODEL, max_tokens=2048, messages=HI,
                                                                tools=[WEATHER, TIME],
                                                                thinking=THINK["thinking"]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    parsed = sse_events(raw)
    for name, data in parsed:
        assert name == data["type"]
        if name != "ping":
            EVENTS.validate_python(data)
    assert [(name, data.get("index"), (data.get("delta") or data.get("content_block") or {}).get("type"))
            for name, data in parsed] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("ping", None, None),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_delta", 3, "input_json_delta"), ("content_block_stop", 3, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    fragments = [data["delta"]["partial_json"] for _, data in parsed
                 if data.get("delta", {}).get("type") == "input_json_delta"]
    assert fragments == ['{"city": ', '"Paris"}', "{", "}"]
    whole = Message.model_validate(chat_to_message(FULL_ANSWER, THINK))
    assert without_id(final) == without_id(whole)
    assert [e.type for e in events].count("input_json") == 4  # the SDK's own event per fragment


def test_stream_with_only_a_tool_call_opens_no_text_block() -> None:
    chunks = [chunk({"role": "assistant"}), call_start(0, "call_a", "weather", '{"city": "Rome"}'),
              chunk({}, "tool_calls"), USAGE]
    with client(serve_chunks(chunks)).messages.stream(model=MODEL, max_tokens=64, messages=HI) as stream:
        final = stream.get_final_message()
    whole = Message.model_validate(chat_to_message(
        answer(None, None, (("call_a", "weather", '{"city": "Rome"}'),)), {"model": MODEL}))
    assert without_id(final) == without_id(whole)
    assert [block.type for block in final.content] == ["tool_use"] and final.stop_reason == "tool_use"


def test_thinking_cut_by_max_tokens() -> None:
    chunks = [chunk({"reasoning": "long "}), chunk({"reasoning": "thought"}), chunk({}, "length"), USAGE]
    with client(serve_chunks(chunks)).messages.stream(model=MODEL, max_tokens=2048, messages=HI,
                                                      thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        thoughts = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert thoughts == ["long ", "thought"]
    whole = Message.model_validate(chat_to_message(answer(None, "long thought", finish="length"), THINK))
    assert without_id(final) == without_id(whole) and final.stop_reason == "max_tokens"


def test_an_empty_stream_has_no_blocks_as_an_empty_message() -> None:
    raw: list[bytes] = []
    with client(serve_chunks([chunk({"role": "assistant", "content": ""}), chunk({}, "stop"), USAGE]),
                raw).messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.content == [] and [name for name, _ in sse_events(raw)] == [
        "message_start", "ping", "message_delta", "message_stop"]


def test_malformed_streamed_arguments_go_out_as_they_are() -> None:
    # The fragments are passed as they arrive; the SDK, as with any malformed partial JSON, raises.
    chunks = [call_start(0, "call_a", "weather", '{"city": '), call_args(0, "Oslo}"), chunk({}, "tool_calls")]
    raw: list[bytes] = []
    with pytest.raises(ValueError, match="Unable to parse tool parameter JSON"):
        with client(serve_chunks(chunks), raw).messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream:
            stream.until_done()
    assert "".join(json.loads(line[6:])["delta"]["partial_json"] for line in b"".join(raw).decode().split("\n")
                   if line.startswith("data: ") and "input_json_delta" in line) == '{"city": Oslo}'



def test_an_escalated_answer_replayed_as_a_stream_keeps_its_thinking_and_tool_use() -> None:
    from services.router.listeners.codecs.openai import as_chunks

    chunks = as_chunks(FULL_ANSWER, chat=True, include_usage=True)
    with client(serve_chunks(chunks)).messages.stream(model=MODEL, max_tokens=2048, messages=HI,
                                                      tools=[WEATHER, TIME], thinking=THINK["thinking"]) as stream:
        final = stream.get_final_message()
    assert without_id(final) == without_id(Message.model_validate(chat_to_message(FULL_ANSWER, THINK)))
