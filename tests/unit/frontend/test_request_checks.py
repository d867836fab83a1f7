"""What the frontend answers a request of the wrong shape, in process through its ASGI app (the engine
sockets a fake bridge): every field of both request bodies, sent with a wrong type, is a 400 naming
the field, never a 500; so are a body nested too deeply and stream_options without stream; unknown
routes and methods are JSON errors in the OpenAI shape (405 with Allow)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.frontend.http_api.app import Frontend
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import frontend_app

HI = [{"role": "user", "content": "hi"}]
BASES: dict[str, dict[str, Any]] = {"/v1/chat/completions": {"model": "tiny", "messages": HI},
                                    "/v1/completions": {"model": "tiny", "prompt": "hi"}}
CHAT, COMPLETIONS = BASES


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app()


def call(app: Frontend, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Answer:
    return asyncio.run(request(app, method, path, body, headers=headers))


def refused_field(app: Frontend, path: str, body: Any, headers: dict[str, str] | None = None) -> str:
    """The field a 400 names, after checking the error's shape."""
    answer = call(app, "POST", path, body, headers)
    assert answer.status == 400 and answer.headers["content-type"] == "application/json", answer.body
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{error['param']}: "), error
    return str(error["param"])


def tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


# One wrong type for every field the frontend reads (openai_schema.py's structs), and for the shapes inside them.
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
    ({"prompt_logprobs": "1"}, "prompt_logprobs"),
    ({"return_tokens_as_token_ids": "yes"}, "return_tokens_as_token_ids"),
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
    ({"prompt": [["x"]]}, "prompt[0]"),  # a batch: the prompt at fault is named
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
    for value in ("one", "1.5", ""):
        assert refused_field(app, CHAT, BASES[CHAT], {"x-data-parallel-rank": value}) == "X-Data-Parallel-Rank"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_options_without_stream_is_a_400_as_in_vllm(app: Frontend, path: str) -> None:
    for stream in ({}, {"stream": False}):
        answer = call(app, "POST", path, {**BASES[path], **stream, "stream_options": {"include_usage": True}})
        assert answer.status == 400 and answer.json()["error"] == {
            "message": "Stream options can only be defined when `stream=True`.", "type": "invalid_request_error",
            "param": "stream_options", "code": 400}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_json_nested_too_deeply_is_a_400(app: Frontend, path: str) -> None:
    answer = call(app, "POST", path, b'{"model": "tiny", "tools": ' + b"[" * 1000 + b"]" * 1000 + b"}")
    assert answer.status == 400 and "nests too deeply" in answer.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path", "status", "allow", "needle"), [
    ("GET", "/v1/nothing", 404, None, "no route for GET /v1/nothing"),
    ("POST", "/health", 405, "GET, HEAD", "/health accepts GET, HEAD only"),
    ("DELETE", "/v1/models", 405, "GET, HEAD", "/v1/models accepts GET, HEAD only"),
    ("GET", "/v1/chat/completions", 405, "POST", "/v1/chat/completions accepts POST only"),
    ("PUT", "/v1/completions", 405, "POST", "/v1/completions accepts POST only"),
])
def test_unknown_routes_and_methods_are_json_errors(app: Frontend, method: str, path: str, status: int,
                                                    allow: str | None, needle: str) -> None:
    answer = call(app, method, path)
    assert answer.status == status and answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert answer.headers.get("allow") == allow and error["message"] == needle
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_a_request_of_the_right_shape_is_answered(app: Frontend) -> None:
    for path, body in BASES.items():
        answer = call(app, "POST", path, {**body, "max_tokens": 1, "stream": None})  # null is false, as in vLLM
        assert answer.status == 200 and answer.json()["usage"]["completion_tokens"] == 1
