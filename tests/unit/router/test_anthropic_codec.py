"""Anthropic Messages codec: request translation, and what the official anthropic SDK makes of our output.

Streams are served through httpx2.MockTransport to an `anthropic.Anthropic` client, so the SDK's own
SSE decoder and message accumulator read exactly the bytes the router would send.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse

from services.frontend.generation.output import usage_body
from services.frontend.http_api import openai_bodies as upstream
from services.router.listeners.codecs.anthropic import MessagesStream, anthropic_error, chat_to_message
from services.router.listeners.codecs.anthropic_request import messages_to_chat
from services.router.listeners.codecs.codec import CodecError
from tests.support.sdk_mock import sse_events, sse_http

MODEL = "qwen-test"
HI = [{"role": "user", "content": "hi"}]


def chat_chunks(pieces: list[str], finish: str = "stop", stop_reason: int | str | None = None,
                usage: tuple[int, int, int] = (12, 3, 0)) -> list[dict[str, Any]]:
    """The chunks a fleet frontend streams for these pieces, with include_usage set, parsed."""
    writer = upstream.ChunkWriter("chatcmpl-1", MODEL, chat=True)
    raw = [writer.role(), *(writer.text(p) for p in pieces), writer.finish(finish, stop_reason),
           writer.usage(usage_body(*usage))]
    return [json.loads(event.removeprefix(b"data: ")) for event in raw]


def chat_body(text: str, finish: str = "stop", stop_reason: int | str | None = None,
              usage: tuple[int, int, int] = (12, 3, 0)) -> dict[str, Any]:
    return json.loads(upstream.chat_completion("chatcmpl-1", MODEL, text, finish, stop_reason, usage_body(*usage)))


def replay(chunks: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Iterator[bytes]]:
    """What the router's server does with a streamed Messages request, upstream replaced by `chunks`."""
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        seen.append(messages_to_chat(body))
        stream = MessagesStream(body)
        yield stream.start(None)
        for chunk in chunks:
            yield stream.feed(chunk)
        yield stream.finish()
    return serve


def client(serve: Callable[[dict[str, Any]], Iterator[bytes]], raw: list[bytes] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url="http://router.test", http_client=sse_http(serve, raw),
                               max_retries=0)


# request translation


def test_system_messages_and_sampling() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 100, "system": "be brief", "temperature": 0.3,
                             "top_p": 0.8, "top_k": 40, "stop_sequences": ["###", "\n\nHuman:"],
                             "metadata": {"user_id": "u1"},
                             "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                          {"role": "user", "content": [{"type": "text", "text": "again",
                                                                        "cache_control": {"type": "ephemeral"}}]}]})
    assert chat == {"model": MODEL, "max_tokens": 100, "temperature": 0.3, "top_p": 0.8, "top_k": 40,
                    "stop": ["###", "\n\nHuman:"],
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "yo"},
                                 {"role": "user", "content": [{"type": "text", "text": "again"}]}]}


def test_system_blocks_become_one_system_message() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 5, "messages": HI,
                             "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert chat["messages"][0] == {"role": "system", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}


def test_a_final_assistant_turn_is_continued_as_a_prefill() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 5,
                             "messages": [*HI, {"role": "assistant", "content": "{\"answer\":"}]})
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


def test_streaming_always_asks_upstream_for_usage() -> None:
    chat = messages_to_chat({"model": MODEL, "max_tokens": 5, "messages": HI, "stream": True})
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("change", "param"), [
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "messages[0].content[1].type"),
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": "{}"}]}]}, "messages[1].content[0].input"),
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "t1", "name": "web_search", "input": {}}]}]}, "messages[1].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "1"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]},
     "messages[0].content[0].content[0].type"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": ""}, "model"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": "###"}, "stop_sequences"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"}]}, "tools[1].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}},
     "tool_choice.name"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),  # not < max_tokens
    ({"thinking": {"type": "adaptive"}}, "thinking.type"),
])
def test_unsupported_requests_name_the_field(change: dict[str, Any], param: str) -> None:
    with pytest.raises(CodecError) as info:
        messages_to_chat({"model": MODEL, "max_tokens": 16, "messages": HI, **change})
    assert info.value.param == param
    assert str(info.value).startswith(param + ": ")


# non-streamed messages


def test_end_turn_message_parses_as_the_sdk_message() -> None:
    message = Message.model_validate(chat_to_message(chat_body("你好，世界", usage=(20, 4, 16)), {"model": MODEL}))
    assert message.id.startswith("msg_") and message.model == MODEL
    assert [(b.type, b.text) for b in message.content if b.type == "text"] == [("text", "你好，世界")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    # Anthropic counts cache reads apart from input_tokens.
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (4, 16, 4)


@pytest.mark.parametrize(("finish", "matched", "expected"), [
    ("stop", "###", ("stop_sequence", "###")),
    ("stop", 151645, ("end_turn", None)),  # an EOS token id, not a stop string
    ("stop", None, ("end_turn", None)),
    ("length", None, ("max_tokens", None)),
])
def test_stop_reasons(finish: str, matched: int | str | None, expected: tuple[str, str | None]) -> None:
    request = {"model": MODEL, "stop_sequences": ["###"]}
    message = Message.model_validate(chat_to_message(chat_body("x", finish, matched), request))
    assert (message.stop_reason, message.stop_sequence) == expected


def test_an_empty_completion_has_no_content_blocks() -> None:
    assert Message.model_validate(chat_to_message(chat_body(""), {"model": MODEL})).content == []


def test_the_sdk_client_reads_a_non_streamed_message() -> None:
    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        return httpx2.Response(200, json=chat_to_message(chat_body("hello", "stop", "###"), body))
    http = httpx2.Client(transport=httpx2.MockTransport(handle))
    sdk = anthropic.Anthropic(api_key="test", base_url="http://router.test", http_client=http, max_retries=0)
    message = sdk.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                  stop_sequences=["###"])
    assert message.content[0].type == "text" and message.content[0].text == "hello"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "###")


# streams


def test_stream_accumulates_in_the_sdk_with_usage_and_stop_sequence() -> None:
    pieces = ["你好", "，", "世界", "! 🌍"]
    seen: list[dict[str, Any]] = []
    sdk = client(replay(chat_chunks(pieces, "stop", "###", usage=(9, 4, 8)), seen))
    with sdk.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "说你好"}],
                             stop_sequences=["###"]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == pieces
    assert [b.text for b in final.content if b.type == "text"] == ["".join(pieces)]
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "###")
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (1, 8, 4)
    assert seen[0]["stop"] == ["###"] and seen[0]["stream_options"] == {"include_usage": True}


def test_every_stream_event_validates_in_order() -> None:
    raw: list[bytes] = []
    sdk = client(replay(chat_chunks(["a", "b"], finish="length"), []), raw)
    events = list(sdk.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}],
                                      stream=True))
    parsed = sse_events(raw)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    for name, data in parsed:
        assert name == data["type"]
        if name != "ping":
            adapter.validate_python(data)
    assert [name for name, _ in parsed] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                            "content_block_delta", "content_block_stop", "message_delta",
                                            "message_stop"]
    delta = events[-2]
    assert delta.type == "message_delta" and delta.delta.stop_reason == "max_tokens"
    assert delta.usage.output_tokens == 3


def test_input_tokens_known_at_start_show_in_message_start() -> None:
    [(_, start), *_] = sse_events([MessagesStream({"model": MODEL}).start(42)])
    assert start["message"]["usage"] == {"input_tokens": 42, "output_tokens": 0}


def test_an_upstream_error_mid_stream_raises_in_the_sdk() -> None:
    def serve(body: dict[str, Any]) -> Iterator[bytes]:
        stream = MessagesStream(body)
        yield stream.start(5)
        yield stream.feed(chat_chunks(["partial"])[1])
        yield stream.feed({"error": {"message": "no replica", "type": "engine_error", "code": 503}})
        yield stream.finish()  # the server's normal end path must add nothing after an error
    sdk = client(serve)
    with pytest.raises(anthropic.APIStatusError) as info:
        with sdk.messages.stream(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]) as stream:
            stream.until_done()
    assert info.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "no replica"}}


# error bodies


@pytest.mark.parametrize(("status", "kind", "raised"), [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (404, "not_found_error", anthropic.NotFoundError),
    (429, "rate_limit_error", anthropic.RateLimitError),
    (500, "api_error", anthropic.InternalServerError),
    (503, "overloaded_error", anthropic.InternalServerError),
    (529, "overloaded_error", anthropic.InternalServerError),
])
def test_error_bodies_by_status(status: int, kind: str, raised: type[Exception]) -> None:
    body = anthropic_error(status, "nope")
    assert ErrorResponse.model_validate(body).error.type == kind

    def handle(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, json=body)
    http = httpx2.Client(transport=httpx2.MockTransport(handle))
    sdk = anthropic.Anthropic(api_key="test", base_url="http://router.test", http_client=http, max_retries=0)
    with pytest.raises(raised) as info:
        sdk.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert info.value.body == body  # type: ignore[attr-defined]
