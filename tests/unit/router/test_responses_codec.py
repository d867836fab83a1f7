"""Responses API codec: request translation, and what the official openai SDK makes of our output.

Streams are served through httpx2.MockTransport to an `openai.OpenAI` client, so the SDK's own SSE
decoder and event accumulator read exactly the bytes the router would send.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from services.frontend.generation.output import usage_body
from services.frontend.http_api import openai_bodies as upstream
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.responses import ResponsesStream, chat_to_response
from services.router.listeners.codecs.responses_request import responses_to_chat
from tests.support.sdk_mock import sse_events, sse_http

MODEL = "qwen-test"


def chat_chunks(pieces: list[str], finish: str = "stop", stop_reason: int | str | None = None,
                usage: tuple[int, int, int] = (12, 3, 0)) -> list[dict[str, Any]]:
    """The chunks a fleet frontend streams for these pieces, with include_usage set, parsed."""
    writer = upstream.ChunkWriter("chatcmpl-1", MODEL, chat=True)
    raw = [writer.role(), *(writer.text(p) for p in pieces), writer.finish(finish, stop_reason),
           writer.usage(usage_body(*usage))]
    return [json.loads(event.removeprefix(b"data: ")) for event in raw]


def chat_body(text: str, finish: str = "stop", usage: tuple[int, int, int] = (12, 3, 0)) -> dict[str, Any]:
    return json.loads(upstream.chat_completion("chatcmpl-1", MODEL, text, finish, None, usage_body(*usage)))


def replay(chunks: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Iterator[bytes]]:
    """What the router's server does with a streamed Responses request, upstream replaced by `chunks`."""
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        seen.append(responses_to_chat(body))
        stream = ResponsesStream(body)
        yield stream.start()
        for chunk in chunks:
            yield stream.feed(chunk)
        yield stream.finish()
    return serve


def client(serve: Callable[[dict[str, Any]], Iterator[bytes]], raw: list[bytes] | None = None) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url="http://router.test/v1", http_client=sse_http(serve, raw),
                         max_retries=0)


# request translation


def test_string_input_with_instructions_and_sampling() -> None:
    chat = responses_to_chat({"model": MODEL, "input": "hi", "instructions": "be brief", "max_output_tokens": 50,
                              "temperature": 0.2, "top_p": 0.9, "metadata": {"k": "v"}, "store": True, "user": "u1"})
    assert chat == {"model": MODEL, "max_tokens": 50, "temperature": 0.2, "top_p": 0.9,
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}


def test_message_list_keeps_roles_and_text_parts() -> None:
    chat = responses_to_chat({"model": MODEL, "input": [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"role": "user", "content": "d"}]})
    assert chat["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
        {"role": "user", "content": "d"}]
    assert "stream" not in chat


def test_streaming_always_asks_upstream_for_usage() -> None:
    chat = responses_to_chat({"model": MODEL, "input": "hi", "stream": True})
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_harmless_defaults_are_accepted() -> None:
    responses_to_chat({"model": MODEL, "input": "hi", "tools": [], "tool_choice": "auto", "reasoning": None,
                       "text": {"format": {"type": "text"}}, "truncation": "disabled", "previous_response_id": None})


@pytest.mark.parametrize(("change", "param"), [
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"},
                                             {"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[1].type"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "computer_call", "call_id": "c", "action": {}}]},
     "input[1].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"input": None}, "input"),
    ({"model": None}, "model"),
    ({"instructions": ["x"]}, "instructions"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"stream": "yes"}, "stream"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}, "tools[1].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
    ({"tools": {"type": "function", "name": "f"}}, "tools"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice.name"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
    ({"tools": [{"type": "function", "name": "f"}], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"input": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]}, "input[0].output"),
    ({"input": [{"type": "reasoning", "id": "rs", "summary": [{"type": "x"}]}]}, "input[0].summary[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    # An id is honoured where the router keeps state (listeners/responses_api.py); it is a string.
    ({"previous_response_id": 1}, "previous_response_id"),
    ({"conversation": {"name": "conv_1"}}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}}, "text.format.strict"),
    # A role that is no string was looked up in a dict and crashed the router (a 500) before.
    ({"input": [{"role": ["user"], "content": "hi"}]}, "input[0].role"),
])
def test_unsupported_requests_name_the_field(change: dict[str, Any], param: str) -> None:
    with pytest.raises(CodecError) as info:
        responses_to_chat({"model": MODEL, "input": "hi", **change})
    assert info.value.param == param
    assert str(info.value).startswith(param + ": ")


# non-streamed responses


def test_completed_response_parses_as_the_sdk_response() -> None:
    request = {"model": MODEL, "input": "hi", "instructions": "be brief", "temperature": 0.5}
    response = Response.model_validate(chat_to_response(chat_body("你好，世界", usage=(20, 4, 16)), request))
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "你好，世界"
    assert response.output[0].type == "message" and response.output[0].id.startswith("msg_")
    assert response.instructions == "be brief" and response.temperature == 0.5 and response.model == MODEL
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (20, 4, 24)
    assert response.usage.input_tokens_details.cached_tokens == 16


def test_length_finish_is_incomplete_for_max_output_tokens() -> None:
    response = Response.model_validate(chat_to_response(chat_body("cut", finish="length"), {"model": MODEL}))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"


def test_the_sdk_client_reads_a_non_streamed_response() -> None:
    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        assert responses_to_chat(body)["messages"][-1] == {"role": "user", "content": "hi"}
        return httpx2.Response(200, json=chat_to_response(chat_body("hello"), body))
    http = httpx2.Client(transport=httpx2.MockTransport(handle))
    sdk = openai.OpenAI(api_key="test", base_url="http://router.test/v1", http_client=http, max_retries=0)
    assert sdk.responses.create(model=MODEL, input="hi").output_text == "hello"


# streams


def test_stream_accumulates_in_the_sdk_with_usage() -> None:
    pieces = ["你好", "，", "世界", "! 🌍"]
    seen: list[dict[str, Any]] = []
    sdk = client(replay(chat_chunks(pieces, usage=(9, 4, 8)), seen))
    with sdk.responses.stream(model=MODEL, input="说你好", max_output_tokens=64) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == pieces
    assert final.status == "completed" and final.output_text == "".join(pieces)
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (9, 4)
    assert final.usage.input_tokens_details.cached_tokens == 8
    assert seen[0]["max_tokens"] == 64 and seen[0]["stream_options"] == {"include_usage": True}


def test_every_stream_event_validates_and_is_numbered_in_order() -> None:
    raw: list[bytes] = []
    sdk = client(replay(chat_chunks(["a", "b"], finish="length"), []), raw)
    events = list(sdk.responses.create(model=MODEL, input="x", stream=True))
    parsed = sse_events(raw)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    for name, data in parsed:
        assert name == data["type"]
        adapter.validate_python(data)
    assert [data["sequence_number"] for _, data in parsed] == list(range(len(parsed)))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.incomplete"]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output_text == "ab"


def test_an_upstream_error_mid_stream_fails_the_response() -> None:
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        stream = ResponsesStream(body)
        yield stream.start()
        yield stream.feed(chat_chunks(["partial"])[1])
        yield stream.feed({"error": {"message": "engine died", "type": "engine_error", "code": 500}})
        yield stream.finish()  # the server's normal end path must add nothing after a failure
    raw: list[bytes] = []
    events = list(client(serve, raw).responses.create(model=MODEL, input="x", stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.message == "engine died"
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    for _, data in sse_events(raw):
        adapter.validate_python(data)


def test_error_before_start_is_a_lone_error_event() -> None:
    stream = ResponsesStream({"model": MODEL})
    [(name, data)] = sse_events([stream.error("no replica")])
    assert name == "error" and data["message"] == "no replica" and data["sequence_number"] == 0
    assert stream.finish() == b""


def test_text_format_becomes_chat_response_format() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "name": "place", "schema": schema, "strict": True, "description": "a place"}
    chat = responses_to_chat({"model": MODEL, "input": "hi", "text": {"format": fmt}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "place", "schema": schema, "strict": True, "description": "a place"}}
    chat = responses_to_chat({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_object"}}})
    assert chat["response_format"] == {"type": "json_object"}
    for plain in ({"format": {"type": "text"}}, {}):
        assert "response_format" not in responses_to_chat({"model": MODEL, "input": "hi", "text": plain})
