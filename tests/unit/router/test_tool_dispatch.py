"""Tool calls and reasoning through the router's ASGI app and dispatcher to a fake replica and back, on
/v1/responses and /v1/messages: what goes upstream, and the events the client reads, each validated
with the official SDK's types (upstream's event stream arrives cut at arbitrary byte boundaries)."""
from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pydantic
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply

A = "http://a:8000"
SSE = "text/event-stream"
CONFIG: dict[str, Any] = {"listeners": [{"port": 8080}], "pools": {"p": {"model": "p-m", "replicas": [{"url": A}]}},
                          "entries": {"fleet": {"default": ["p"]}}}
HI = [{"role": "user", "content": "weather in Paris?"}]
DELTAS: list[dict[str, Any]] = [
    {"role": "assistant", "content": ""}, {"reasoning_content": "Use the tool."},
    {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                     "function": {"name": "weather", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}]
WHOLE = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "p-m",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": None, "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "call_a", "type": "function",
                             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}}],
         "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}


def stream_bytes() -> tuple[bytes, ...]:
    """The tool turn as upstream's event stream, cut into 7-byte pieces."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "p-m",
                "choices": choices, **extra}
        return b"data: " + json.dumps(data).encode() + b"\n\n"
    raw = b"".join([*(event([{"index": 0, "delta": d, "finish_reason": None}]) for d in DELTAS),
                    event([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
                    event([], usage=WHOLE["usage"]), b"data: [DONE]\n\n"])
    return tuple(raw[i:i + 7] for i in range(0, len(raw), 7))


def post(path: str, body: dict[str, Any], reply: Reply) -> tuple[Answer, dict[str, Any]]:
    router = Router(parse_config(CONFIG), rng=random.Random(1))
    upstream = FakeUpstream()
    upstream.answer(A, reply)
    pools = build_pools(router.config)
    app = RouterApp(router.config, router, pools, upstream, RouterMetrics(pools))
    answer = asyncio.run(request(app, "POST", path, body))
    return answer, upstream.sent[0].body


RESPONSES_TOOLS = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
MESSAGES_TOOLS = [{"name": "weather", "input_schema": {"type": "object"}}]


def test_responses_tool_turn_streamed() -> None:
    r, sent = post("/v1/responses", {"model": "fleet", "input": HI, "stream": True, "tools": RESPONSES_TOOLS,
                                     "tool_choice": "required"}, Reply(chunks=stream_bytes(), content_type=SSE))
    assert sent["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    assert sent["tool_choice"] == "required"
    events = r.events()
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    final = Response.model_validate(events[-1]["response"])
    assert events[-1]["type"] == "response.completed"
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    call = final.output[1]
    assert call.type == "function_call" and (call.call_id, call.arguments) == ("call_a", '{"city": "Paris"}')


def test_responses_tool_turn_whole() -> None:
    r, _ = post("/v1/responses", {"model": "fleet", "input": HI, "tools": RESPONSES_TOOLS},
                Reply(chunks=(json.dumps(WHOLE).encode(),)))
    response = Response.model_validate(r.json())
    assert [item.type for item in response.output] == ["reasoning", "function_call"]


def test_messages_tool_turn_streamed() -> None:
    r, sent = post("/v1/messages", {"model": "fleet", "max_tokens": 2048, "messages": HI, "stream": True,
                                    "thinking": {"type": "enabled", "budget_tokens": 1024},
                                    "tools": MESSAGES_TOOLS, "tool_choice": {"type": "tool", "name": "weather"}},
                   Reply(chunks=stream_bytes(), content_type=SSE))
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    events = r.events()
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            adapter.validate_python(event)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_messages_tool_turn_whole() -> None:
    r, _ = post("/v1/messages", {"model": "fleet", "max_tokens": 2048, "messages": HI, "tools": MESSAGES_TOOLS,
                                 "thinking": {"type": "enabled", "budget_tokens": 1024}},
                Reply(chunks=(json.dumps(WHOLE).encode(),)))
    message = Message.model_validate(r.json())
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    assert message.stop_reason == "tool_use"
