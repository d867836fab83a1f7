"""The preprocessing split on the real vLLM backend (the tiny model, random weights, greedy): render ->
/inference/v1/generate gives the chat route's tokens, and a forced tool_choice rendered as
structured_outputs.json comes back through the token-in route as output that matches the schema."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import FrontendProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
CHAT = [{"role": "user", "content": "Write about the sea."}]


@pytest.fixture(scope="module")
def frontend(vllm_frontend: FrontendProc) -> FrontendProc:
    """A frontend on a headless vLLM rank (tests/vllm/conftest.py: shared across modules)."""
    return vllm_frontend


def post(frontend: FrontendProc, path: str, body: Any) -> Any:
    response = httpx.post(frontend.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("stop", [False, True])
def test_render_then_generate_gives_the_chat_route_s_tokens(frontend: FrontendProc, stop: bool) -> None:
    body: dict[str, Any] = {"model": "tiny", "messages": CHAT, "temperature": 0, "max_tokens": 24}
    with openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        if stop:
            full = client.chat.completions.create(**body).choices[0].message.content or ""
            body["stop"] = [full[len(full) // 2:len(full) // 2 + 3]]
        reply = client.chat.completions.create(**body)
    rendered = post(frontend, "/v1/chat/completions/render", body)
    [choice] = post(frontend, "/inference/v1/generate", {**rendered, "return_text": True})["choices"]
    assert choice["text"] == reply.choices[0].message.content
    assert choice["finish_reason"] == reply.choices[0].finish_reason == ("stop" if stop else "length")
    assert len(choice["token_ids"]) == reply.usage.completion_tokens  # type: ignore[union-attr]


def test_a_rendered_forced_tool_choice_is_honoured_by_the_token_in_route(frontend: FrontendProc) -> None:
    from jsonschema import validate

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"], "additionalProperties": False}}}]
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        # One call at most: random weights would add array items until max_tokens cut them.
        body = {"model": "tiny", "messages": CHAT, "tools": tools, "tool_choice": tool_choice, "max_tokens": 200,
                "temperature": 0, "parallel_tool_calls": False}
        rendered = post(frontend, "/v1/chat/completions/render", body)
        schema = rendered["sampling_params"]["structured_outputs"]["json"]
        [choice] = post(frontend, "/inference/v1/generate", {**rendered, "return_text": True})["choices"]
        assert choice["finish_reason"] == "stop", choice
        validate(json.loads(choice["text"]), schema)
