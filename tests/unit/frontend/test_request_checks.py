"""What the frontend answers a request of the wrong shape, in process through its ASGI app (the engine
sockets a fake bridge): every field of both request bodies, sent with a wrong type, is a 400 naming
the field, never a 500; so are a body nested too deeply and stream_options without stream; unknown
routes and methods are JSON errors in the OpenAI shape (405 with Allow)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from protocol import Ready
from services.frontend.app import Frontend
from services.frontend.config import FrontendConfig
from services.frontend.engines import EngineSet
from services.frontend.metrics import Metrics
from services.frontend.model import Model

HI = [{"role": "user", "content": "hi"}]
BASES: dict[str, dict[str, Any]] = {"/v1/chat/completions": {"model": "tiny", "messages": HI},
                                    "/v1/completions": {"model": "tiny", "prompt": "hi"}}
CHAT, COMPLETIONS = BASES


class _Bridge:
    def send(self, index: int, frames: list[Any]) -> None:
        pass


@pytest.fixture(scope="module")
def app() -> Frontend:
    engines = EngineSet(["tcp://a:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
    engines._bridge = _Bridge()  # type: ignore[assignment]
    for e in engines.engines:
        engines._on_ready(e, Ready(e.index, "tiny", 4096, 16, 1000, "sim", "test", "epoch"), time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=1, data_parallel_size_local=0,
                            engine_addresses=("tcp://a:1",))
    return Frontend(config, Model.load("tiny", "tiny"), engines, Metrics("tiny"))


def call(app: Frontend, method: str, path: str, body: Any = None,
         headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of one request that must be answered before reaching an engine."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers or [], "query_string": b"",
             "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000), "root_path": ""}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    head = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], head, json.loads(data)


def refused_field(app: Frontend, path: str, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> str:
    status, head, answer = call(app, "POST", path, body, headers)
    assert status == 400 and head["content-type"] == "application/json", answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{error['param']}: "), error
    return str(error["param"])


def tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


# One wrong type for every field the frontend reads (schema.py's structs), and for the shapes inside them.
SAMPLING: list[tuple[dict[str, Any], str]] = [
    ({"model": 5}, "model"),
    ({"stream": "yes"}, "stream"),
    ({"stream": True, "stream_options": 5}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options.continuous_usage_stats"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": [1]}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": {}}, "min_p"),
    ({"seed": "x"}, "seed"),
    ({"n": "1"}, "n"),
    ({"stop": 5}, "stop"),
    ({"stop": [5]}, "stop[0]"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": ["5"]}, "stop_token_ids[0]"),
    ({"min_tokens": "1"}, "min_tokens"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"presence_penalty": "x"}, "presence_penalty"),
    ({"frequency_penalty": None}, "frequency_penalty"),
    ({"repetition_penalty": []}, "repetition_penalty"),
    ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output"),
    ({"skip_special_tokens": 0}, "skip_special_tokens"),
    ({"priority": "high"}, "priority"),
    ({"cache_salt": 5}, "cache_salt"),
    ({"user": 5}, "user"),
]
CHAT_ONLY: list[tuple[dict[str, Any], str]] = [
    ({"messages": 5}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [[{"role": "user"}]]}, "messages[0]"),
    ({"messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [123]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "tool_calls": {}}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [5]}]}, "messages[0].tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}, "messages[0].tool_calls[0].function"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 5}]}, "messages[0].reasoning_content"),
    ({"max_completion_tokens": "5"}, "max_completion_tokens"),
    ({"tools": {}}, "tools"),
    ({"tools": [5]}, "tools[0]"),
    ({"tools": [{"type": 5, "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": 5}]}, "tools[0].function"),
    ({"tools": [tool(name=5)]}, "tools[0].function.name"),
    ({"tools": [tool(description=5)]}, "tools[0].function.description"),
    ({"tools": [tool(strict="yes")]}, "tools[0].function.strict"),
    ({"tools": [tool(parameters="x")]}, "tools[0].function.parameters"),
    ({"tools": [tool(parameters={"type": 5})]}, "tools[0].function.parameters.type"),
    ({"tools": [tool()], "tool_choice": 5}, "tool_choice"),
    ({"tools": [tool()], "tool_choice": ["auto"]}, "tool_choice"),
    ({"tools": [tool()], "tool_choice": {"type": "function", "function": 5}}, "tool_choice.function"),
    ({"tools": [tool()], "tool_choice": {"type": "function", "function": {"name": ["f"]}}},
     "tool_choice.function.name"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"add_generation_prompt": "yes"}, "add_generation_prompt"),
    ({"continue_final_message": 1}, "continue_final_message"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": "5"}, "top_logprobs"),
]
COMPLETION_ONLY: list[tuple[dict[str, Any], str]] = [
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [{"a": 1}]}, "prompt"),
    ({"prompt": [["x"]]}, "prompt"),
    ({"echo": "yes"}, "echo"),
    ({"suffix": 5}, "suffix"),
    ({"logprobs": "5"}, "logprobs"),
    ({"add_special_tokens": "no"}, "add_special_tokens"),
]
CASES = ([(CHAT, change, field) for change, field in SAMPLING + CHAT_ONLY]
         + [(COMPLETIONS, change, field) for change, field in SAMPLING + COMPLETION_ONLY])


@pytest.mark.parametrize(("path", "change", "field"), CASES,
                         ids=[f"{path.rsplit('/', 1)[1]}:{field}" for path, _, field in CASES])
def test_a_wrong_type_is_a_400_naming_the_field(app: Frontend, path: str, change: dict[str, Any], field: str) -> None:
    assert refused_field(app, path, {**BASES[path], **change}) == field


def test_a_pinned_rank_that_is_no_integer_is_a_400(app: Frontend) -> None:
    for value in (b"one", b"1.5", b""):
        assert refused_field(app, CHAT, BASES[CHAT], [(b"x-data-parallel-rank", value)]) == "X-Data-Parallel-Rank"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_options_without_stream_is_a_400_as_in_vllm(app: Frontend, path: str) -> None:
    for stream in ({}, {"stream": False}):
        body = {**BASES[path], **stream, "stream_options": {"include_usage": True}}
        status, _, answer = call(app, "POST", path, body)
        assert status == 400 and answer["error"] == {
            "message": "Stream options can only be defined when `stream=True`.", "type": "invalid_request_error",
            "param": "stream_options", "code": 400}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_json_nested_too_deeply_is_a_400(app: Frontend, path: str) -> None:
    status, _, answer = call(app, "POST", path, b'{"model": "tiny", "tools": ' + b"[" * 1000 + b"]" * 1000 + b"}")
    assert status == 400 and "nests too deeply" in answer["error"]["message"]


@pytest.mark.parametrize(("method", "path", "status", "allow", "needle"), [
    ("GET", "/v1/nothing", 404, None, "no route for GET /v1/nothing"),
    ("POST", "/health", 405, "GET, HEAD", "/health accepts GET, HEAD only"),
    ("DELETE", "/v1/models", 405, "GET, HEAD", "/v1/models accepts GET, HEAD only"),
    ("GET", "/v1/chat/completions", 405, "POST", "/v1/chat/completions accepts POST only"),
    ("PUT", "/v1/completions", 405, "POST", "/v1/completions accepts POST only"),
])
def test_unknown_routes_and_methods_are_json_errors(app: Frontend, method: str, path: str, status: int,
                                                    allow: str | None, needle: str) -> None:
    got, head, answer = call(app, method, path)
    assert got == status and head["content-type"] == "application/json"
    assert head.get("allow") == allow and answer["error"]["message"] == needle
    assert answer["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
