"""Responses API codec, tools and reasoning: function tools and calls both ways, reasoning items, and
what the official openai SDK makes of them, streamed (its event types and stream accumulator) and not."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.responses import ResponsesStream, chat_to_response
from services.router.listeners.codecs.responses_request import responses_to_chat
from tests.support.sdk_mock import sse_events, sse_http

MODEL = "qwen-test"
WEATHER = {"type": "function", "name": "weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": False}
TIME = {"type": "function", "name": "time", "parameters": {"type": "object", "properties": {}}}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


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

# The same answer streamed: reasoning, text, then two calls whose arguments come in fragments.
FULL_STREAM = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "The user wants "}),
               chunk({"reasoning_content": "weather and time."}), chunk({"content": "Let me check."}),
               call_start(0, "call_a", "weather"), call_args(0, '{"city": '), call_args(0, '"Paris"}'),
               call_start(1, "call_b", "time", "{"), call_args(1, "}"), chunk({}, "tool_calls"), USAGE]
FULL_ANSWER = answer("Let me check.", "The user wants weather and time.",
                     (("call_a", "weather", '{"city": "Paris"}'), ("call_b", "time", "{}")))


def serve_chunks(chunks: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Iterator[bytes]]:
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        responses_to_chat(body)
        stream = ResponsesStream(body)
        yield stream.start()
        for piece in chunks:
            yield stream.feed(piece)
        yield stream.finish()
    return serve


def client(serve: Callable[[dict[str, Any]], Iterator[bytes]], raw: list[bytes] | None = None) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url="http://router.test/v1", http_client=sse_http(serve, raw),
                         max_retries=0)


def without_ids(response: Response) -> dict[str, Any]:
    """A response's content: what two answers to the same request share (no ids or clock times)."""
    body = response.model_dump(exclude_none=True)
    for name in ("id", "created_at", "completed_at"):
        body.pop(name, None)
    for item in body["output"]:
        item.pop("id", None)
    return body


# request translation


def test_function_tools_choice_and_parallel_calls_go_up_in_chat_shape() -> None:
    chat = responses_to_chat({"model": MODEL, "input": "hi", "tools": [WEATHER, TIME],
                              "tool_choice": {"type": "function", "name": "weather"}, "parallel_tool_calls": False})
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": WEATHER["parameters"], "strict": False}},
        {"type": "function", "function": {"name": "time", "parameters": TIME["parameters"]}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["parallel_tool_calls"] is False


@pytest.mark.parametrize("choice", ["none", "auto", "required"])
def test_tool_choice_strings_pass_as_they_are(choice: str) -> None:
    assert responses_to_chat({"model": MODEL, "input": "hi", "tools": [TIME], "tool_choice": choice})[
        "tool_choice"] == choice


def test_no_tools_sends_no_tool_fields() -> None:
    chat = responses_to_chat({"model": MODEL, "input": "hi", "tools": [], "tool_choice": "none",
                              "parallel_tool_calls": True})
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & chat.keys()


def test_reasoning_effort_goes_up_and_summary_is_accepted() -> None:
    chat = responses_to_chat({"model": MODEL, "input": "hi", "reasoning": {"effort": "low", "summary": "auto"}})
    assert chat["reasoning_effort"] == "low"


def test_a_tool_loop_becomes_assistant_tool_calls_and_tool_messages() -> None:
    chat = responses_to_chat({"model": MODEL, "tools": [WEATHER, TIME], "input": [
        {"role": "user", "content": "weather and time in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Two tools."}], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]},
        {"type": "function_call", "call_id": "call_c", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_c", "output": "12:01"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Answer now."}]},
        {"role": "user", "content": "and?"}]})
    assert chat["messages"] == [
        {"role": "user", "content": "weather and time in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "reasoning_content": "Two tools.",
         "tool_calls": [
             {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "noon"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_c", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_c", "content": "12:01"},
        # a reasoning item with no message or call after it has no chat message to ride on: dropped
        {"role": "user", "content": "and?"}]


def test_reasoning_before_a_final_assistant_message_rides_on_it() -> None:
    chat = responses_to_chat({"model": MODEL, "input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "brief"}]},
        {"role": "assistant", "content": "a1"}, {"role": "assistant", "content": "a2"}]})
    assert chat["messages"][1:] == [{"role": "assistant", "content": "a1", "reasoning_content": "brief"},
                                    {"role": "assistant", "content": "a2"}]


def test_the_sdk_sends_what_the_adapter_reads() -> None:
    seen: list[dict[str, Any]] = []

    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        seen.append(responses_to_chat(body))
        yield from serve_chunks(FULL_STREAM)(body)
    sdk = client(serve)
    with sdk.responses.stream(model=MODEL, input="hi", tools=[WEATHER, TIME], tool_choice="required",
                              parallel_tool_calls=True) as stream:
        stream.until_done()
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["weather", "time"]
    assert seen[0]["tool_choice"] == "required" and seen[0]["parallel_tool_calls"] is True


# non-streamed


def test_reasoning_message_and_calls_are_output_in_that_order() -> None:
    request = {"model": MODEL, "input": "hi", "tools": [WEATHER, TIME], "tool_choice": "auto"}
    response = Response.model_validate(chat_to_response(FULL_ANSWER, request))
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, _, weather, time = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert reasoning.content is not None and [(c.type, c.text) for c in reasoning.content] == [
        ("reasoning_text", "The user wants weather and time.")]
    assert response.output_text == "Let me check."
    assert weather.type == "function_call" and time.type == "function_call"
    assert (weather.call_id, weather.name, json.loads(weather.arguments), weather.status) == (
        "call_a", "weather", {"city": "Paris"}, "completed")
    assert weather.id is not None and weather.id.startswith("fc_") and weather.id != time.id
    assert (time.call_id, time.name, time.arguments) == ("call_b", "time", "{}")
    assert response.status == "completed"  # tool_calls is a finished turn
    assert [t.type for t in response.tools] == ["function", "function"] and response.tool_choice == "auto"
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 0


def test_calls_without_text_have_no_message_item() -> None:
    response = Response.model_validate(chat_to_response(
        answer(None, None, (("call_a", "weather", '{"city": "Oslo"}'),)), {"model": MODEL, "tools": [WEATHER]}))
    assert [item.type for item in response.output] == ["function_call"] and response.output_text == ""


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_under_either_name(field: str) -> None:
    response = Response.model_validate(chat_to_response(answer("4", "2+2", finish="stop", field=field),
                                                        {"model": MODEL}))
    assert [item.type for item in response.output] == ["reasoning", "message"]


def test_a_named_tool_choice_and_reasoning_options_are_echoed() -> None:
    request = {"model": MODEL, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "weather"},
               "reasoning": {"effort": "high", "summary": "auto"}, "parallel_tool_calls": False}
    response = Response.model_validate(chat_to_response(FULL_ANSWER, request))
    assert response.tool_choice.type == "function" and response.tool_choice.name == "weather"
    assert response.reasoning is not None and response.reasoning.effort == "high"
    assert response.parallel_tool_calls is False


# streams


def test_a_streamed_tool_turn_accumulates_in_the_sdk_to_the_non_streamed_response() -> None:
    raw: list[bytes] = []
    request = {"model": MODEL, "input": "hi", "tools": [WEATHER, TIME]}
    sdk = client(serve_chunks(FULL_STREAM), raw)
    with sdk.responses.stream(model=MODEL, input="hi", tools=[WEATHER, TIME]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    parsed = sse_events(raw)
    for name, data in parsed:
        assert name == data["type"]
        EVENTS.validate_python(data)
    assert [data["sequence_number"] for _, data in parsed] == list(range(len(parsed)))
    assert [name for name, _ in parsed] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added = [data["output_index"] for name, data in parsed if name == "response.output_item.added"]
    assert added == [0, 1, 2, 3]
    assert all(data["content_index"] == 0 for _, data in parsed if "content_index" in data)
    # each item's events name its own output index and id
    ids = {data["output_index"]: data["item"]["id"] for name, data in parsed if name == "response.output_item.added"}
    assert all(ids[data["output_index"]] == data["item_id"] for _, data in parsed if "item_id" in data)
    snapshots = [e.snapshot for e in events if e.type == "response.function_call_arguments.delta"]
    assert snapshots == ['{"city": ', '{"city": "Paris"}', "{", "{}"]
    completed = Response.model_validate(parsed[-1][1]["response"])
    assert without_ids(completed) == without_ids(Response.model_validate(chat_to_response(FULL_ANSWER, request)))
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call", "function_call"]
    assert final.output_text == "Let me check."
    assert [(c.call_id, c.arguments) for c in final.output if c.type == "function_call"] == [
        ("call_a", '{"city": "Paris"}'), ("call_b", "{}")]
    assert final.usage is not None and final.usage.output_tokens == 20


def test_strict_tools_are_parsed_by_the_sdk() -> None:
    strict = {**WEATHER, "strict": True}
    chunks = [call_start(0, "call_a", "weather", '{"city":'), call_args(0, ' "Rome"}'), chunk({}, "tool_calls")]
    with client(serve_chunks(chunks)).responses.stream(model=MODEL, input="hi", tools=[strict]) as stream:
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.parsed_arguments == {"city": "Rome"}


def test_interleaved_call_fragments_land_on_their_own_items() -> None:
    chunks = [call_start(0, "call_a", "weather"), call_start(1, "call_b", "time"), call_args(0, '{"city": "Oslo"}'),
              call_args(1, "{}"), chunk({}, "tool_calls")]
    raw: list[bytes] = []
    with client(serve_chunks(chunks), raw).responses.stream(model=MODEL, input="hi") as stream:
        final = stream.get_final_response()
    assert [(c.call_id, c.arguments) for c in final.output if c.type == "function_call"] == [
        ("call_a", '{"city": "Oslo"}'), ("call_b", "{}")]
    for _, data in sse_events(raw):
        EVENTS.validate_python(data)


def test_reasoning_cut_by_the_token_limit_is_incomplete() -> None:
    chunks = [chunk({"reasoning": "hmm"}), chunk({"reasoning": " let me"}), chunk({}, "length"), USAGE]
    raw: list[bytes] = []
    events = list(client(serve_chunks(chunks), raw).responses.create(model=MODEL, input="x", stream=True))
    last = events[-1]
    assert last.type == "response.incomplete"
    [item] = last.response.output
    assert item.type == "reasoning" and item.status == "incomplete"
    assert item.content is not None and item.content[0].text == "hmm let me"
    streamed = Response.model_validate(sse_events(raw)[-1][1]["response"])
    whole = Response.model_validate(chat_to_response(answer(None, "hmm let me", finish="length"), {"model": MODEL}))
    assert without_ids(streamed) == without_ids(whole)


def test_text_cut_after_reasoning_leaves_the_reasoning_completed() -> None:
    chunks = [chunk({"reasoning_content": "think"}), chunk({"content": "The ans"}), chunk({}, "length"), USAGE]
    raw: list[bytes] = []
    with client(serve_chunks(chunks), raw).responses.stream(model=MODEL, input="x") as stream:
        stream.until_done()
    streamed = Response.model_validate(sse_events(raw)[-1][1]["response"])
    assert [(item.type, item.status) for item in streamed.output] == [("reasoning", "completed"),
                                                                      ("message", "incomplete")]
    whole = Response.model_validate(chat_to_response(answer("The ans", "think", finish="length"), {"model": MODEL}))
    assert without_ids(streamed) == without_ids(whole)


def test_an_error_mid_call_fails_with_the_items_so_far() -> None:
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        stream = ResponsesStream(body)
        yield stream.start()
        yield stream.feed(chunk({"content": "Checking."}))
        yield stream.feed(call_start(0, "call_a", "weather", '{"ci'))
        yield stream.feed({"error": {"message": "engine died", "type": "engine_error", "code": 500}})
        yield stream.finish()
    raw: list[bytes] = []
    events = list(client(serve, raw).responses.create(model=MODEL, input="x", stream=True))
    failed = events[-1]
    assert failed.type == "response.failed"
    assert [(item.type, item.status) for item in failed.response.output] == [("message", "completed"),
                                                                             ("function_call", "incomplete")]
    for _, data in sse_events(raw):
        EVENTS.validate_python(data)


def test_unknown_tool_types_are_refused_by_index() -> None:
    with pytest.raises(CodecError) as info:
        responses_to_chat({"model": MODEL, "input": "hi", "tools": [TIME, {"type": "mcp", "server_label": "x"}]})
    assert info.value.param == "tools[1].type" and "'mcp'" in info.value.message
