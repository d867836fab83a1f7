"""The render routes (services/frontend/http_api/render.py) and render-only mode: vLLM's shape, the rendered
request read back by the token-in route as the same engine request the chat and completions routes
send, and a frontend with no engine."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol import GenerateRequest, Ready
from services.frontend.config import parse_args
from services.frontend.http_api.app import Frontend
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import AnsweringBridge, frontend_app, render_only_app

HI = [{"role": "user", "content": "Hello there"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app(max_model_len=2048)


def call(app: Frontend, path: str, body: Any = None, method: str = "POST") -> Answer:
    return asyncio.run(request(app, method, path, body))


def sent(app: Frontend) -> GenerateRequest:
    bridge = app.engines._bridge
    assert isinstance(bridge, AnsweringBridge)
    return bridge.requests[-1]


def test_chat_render_answers_vllm_s_generate_request(app: Frontend) -> None:
    answer = call(app, "/v1/chat/completions/render", {"model": "tiny", "messages": HI, "max_tokens": 7,
                                                       "temperature": 0, "stream": True,
                                                       "stream_options": {"include_usage": True}})
    assert answer.status == 200
    body = answer.json()
    assert set(body) == {"request_id", "token_ids", "assistant_tokens_mask", "token_offsets", "features",
                         "sampling_params", "model", "stream", "stream_options", "cache_salt", "priority",
                         "kv_transfer_params", "ec_transfer_params"}
    assert body["request_id"].startswith("chatcmpl-") and body["model"] == "tiny" and body["stream"] is True
    tokens = call(app, "/tokenize", {"messages": HI}).json()["tokens"]
    assert body["token_ids"] == tokens
    # vLLM's serialization: defaults left out, but max_tokens always (render.py says why); DELTA when streamed.
    assert body["sampling_params"] == {"temperature": 0.0, "max_tokens": 7, "output_kind": 1}
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}


def test_completion_render_is_a_list(app: Frontend) -> None:
    answer = call(app, "/v1/completions/render", {"model": "tiny", "prompt": "Once upon", "cache_salt": "s",
                                                  "priority": 3})
    assert answer.status == 200
    [body] = answer.json()
    assert body["request_id"].startswith("cmpl-") and body["cache_salt"] == "s" and body["priority"] == 3
    assert body["sampling_params"] == {"max_tokens": 16, "output_kind": 2}  # the completions default
    assert body["token_ids"] == app.model.tokenizer.encode("Once upon").ids


def test_a_batch_renders_one_request_per_prompt_and_n_as_vllm(app: Frontend) -> None:
    answer = call(app, "/v1/completions/render", {"model": "tiny", "prompt": ["Once upon", [9707, 11]], "n": 2,
                                                  "seed": 5})
    assert answer.status == 200
    first, second = answer.json()
    assert first["token_ids"] == app.model.tokenizer.encode("Once upon").ids and second["token_ids"] == [9707, 11]
    assert first["request_id"] != second["request_id"]
    assert first["sampling_params"] == second["sampling_params"] == {"seed": 5, "max_tokens": 16, "n": 2,
                                                                      "output_kind": 2}
    chat = call(app, "/v1/chat/completions/render", {"model": "tiny", "messages": HI, "max_tokens": 2, "n": 3}).json()
    assert chat["sampling_params"] == {"max_tokens": 2, "n": 3, "output_kind": 2}
    refused = call(app, "/inference/v1/generate", chat)  # as vLLM's generate route: one sequence per request
    assert refused.status == 400 and refused.json()["error"]["param"] == "sampling_params.n"


# Chat and completion bodies whose rendered request must come back as the request the route itself sends.
ROUND_TRIPS: list[tuple[str, dict[str, Any]]] = [
    ("chat", {}),
    ("chat", {"max_tokens": 16}),  # vLLM's SamplingParams default: still written
    ("chat", {"temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "max_tokens": 9}),
    ("chat", {"stop": ["\n\n", "END"], "stop_token_ids": [13], "include_stop_str_in_output": True,
              "skip_special_tokens": False, "min_tokens": 2, "ignore_eos": True, "max_tokens": 20}),
    ("chat", {"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "priority": -4,
              "cache_salt": "tenant-a"}),
    ("chat", {"stop": "x", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("chat", {"tools": TOOLS, "tool_choice": "none", "chat_template_kwargs": {"enable_thinking": False}}),
    ("completion", {"prompt": "Once upon a time"}),
    ("completion", {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0.3}),
    ("completion", {"prompt": "Hi", "add_special_tokens": False, "stop": ["."], "seed": 1}),
]


@pytest.mark.parametrize(("kind", "fields"), ROUND_TRIPS, ids=[f"{k}:{f}" for k, f in ROUND_TRIPS])
def test_render_then_generate_sends_what_the_route_sends(app: Frontend, kind: str, fields: dict[str, Any]) -> None:
    body = {"model": "tiny", **({"messages": HI} if kind == "chat" else {}), **fields}
    route = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    direct = call(app, route, body)
    assert direct.status == 200, direct.body
    expected = sent(app)
    rendered = call(app, route + "/render", body).json()
    generated = call(app, "/inference/v1/generate", rendered if kind == "chat" else rendered[0])
    assert generated.status == 200, generated.body
    got = sent(app)
    assert got.prompt_token_ids == expected.prompt_token_ids
    assert got.sampling == expected.sampling
    assert (got.priority, got.cache_salt) == (expected.priority, expected.cache_salt)


def test_a_forced_tool_choice_renders_its_schema_as_structured_outputs(app: Frontend) -> None:
    # The sim engine cannot guarantee it: chat refuses it there, render does not ask the engines.
    body = {"model": "tiny", "messages": HI, "tools": TOOLS, "tool_choice": "required"}
    assert call(app, "/v1/chat/completions", body).json()["error"]["param"] == "tool_choice"
    rendered = call(app, "/v1/chat/completions/render", body).json()
    schema = rendered["sampling_params"]["structured_outputs"]["json"]
    assert schema["type"] == "array" and schema["items"]["anyOf"][0]["properties"]["name"]["enum"] == ["get_weather"]
    refused = call(app, "/inference/v1/generate", rendered)  # and the token-in route asks them
    assert refused.status == 400 and refused.json()["error"]["param"] == "sampling_params.structured_outputs.json"


VLLM_ROUND_TRIPS: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"response_format": {"type": "json_object"}}),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}}),
    ("chat", {"structured_outputs": {"regex": "[a-z]+"}, "logit_bias": {"11": 2.5}, "bad_words": ["no"]}),
    ("chat", {"guided_choice": ["yes", "no"], "allowed_token_ids": [11, 12, 13]}),
    ("completion", {"prompt": "Hi", "structured_outputs": {"grammar": 'root ::= "a" | "b"'}}),
    ("completion", {"prompt": "one two three four", "truncate_prompt_tokens": 2}),
]


@pytest.mark.parametrize(("kind", "fields"), VLLM_ROUND_TRIPS, ids=[f"{k}:{f}" for k, f in VLLM_ROUND_TRIPS])
def test_structured_outputs_and_logits_controls_render_and_come_back(kind: str, fields: dict[str, Any]) -> None:
    """Rendered for, and sent to, vllm engines (the sim refuses them): the same engine request."""
    app = frontend_app(max_model_len=2048, backend="vllm", minor=3)
    body = {"model": "tiny", **({"messages": HI} if kind == "chat" else {}), **fields}
    route = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    direct = call(app, route, body)
    assert direct.status == 200, direct.body
    expected = sent(app)
    rendered = call(app, route + "/render", body).json()
    generated = call(app, "/inference/v1/generate", rendered if kind == "chat" else rendered[0])
    assert generated.status == 200, generated.body
    assert (sent(app).prompt_token_ids, sent(app).sampling) == (expected.prompt_token_ids, expected.sampling)


def test_render_refuses_what_the_route_refuses(app: Frontend) -> None:
    for path, body, param in (
            ("/v1/chat/completions/render", {"model": "tiny", "messages": []}, "messages"),
            ("/v1/chat/completions/render", {"model": "tiny", "messages": HI, "max_tokens": 5000}, "max_tokens"),
            ("/v1/chat/completions/render", {"model": "tiny", "messages": HI, "temperature": 3}, "temperature"),
            ("/v1/chat/completions/render", {"model": "gpt-9", "messages": HI}, "model"),
            ("/v1/completions/render", {"model": "tiny", "prompt": ""}, "prompt"),
            ("/v1/completions/render", {"model": "tiny", "prompt": "x", "logprobs": 21}, "logprobs"),
            ("/v1/chat/completions/render", {"model": "tiny", "messages": HI, "top_logprobs": 2}, "top_logprobs")):
        answer = call(app, path, body)
        assert answer.status in (400, 404) and answer.json()["error"]["param"] == param, answer.body


def test_logprobs_render_as_vllm_s_sampling_params_and_the_token_in_route_sends_them(app: Frontend) -> None:
    """As vLLM's to_sampling_params: chat's top_logprobs once logprobs is true, and an echoed completion's
    prompt_logprobs default to its logprobs (the echo itself is the response's, not the token-in request's)."""
    chat = call(app, "/v1/chat/completions/render", {"model": "tiny", "messages": HI, "max_tokens": 2,
                                                     "logprobs": True, "prompt_logprobs": 1}).json()
    assert chat["sampling_params"] == {"max_tokens": 2, "logprobs": 0, "prompt_logprobs": 1, "output_kind": 2}
    [text] = call(app, "/v1/completions/render", {"model": "tiny", "prompt": "x", "logprobs": 3,
                                                  "echo": True}).json()
    assert text["sampling_params"] == {"max_tokens": 16, "logprobs": 3, "prompt_logprobs": 3, "output_kind": 2}
    assert call(app, "/inference/v1/generate", chat).status == 200
    assert (sent(app).sampling.logprobs, sent(app).sampling.prompt_logprobs) == (0, 1)


def test_render_asks_no_engine_whether_it_sends_logprobs() -> None:
    app = frontend_app()
    engine = app.engines.engines[0]
    app.engines._on_ready(engine, Ready(0, "tiny", 4096, 16, 1000, "vllm", "old", "epoch-2", 0, 1, 2),
                          time.monotonic())
    body = {"model": "tiny", "messages": HI, "logprobs": True, "top_logprobs": 2}
    assert call(app, "/v1/chat/completions", body).json()["error"]["param"] == "top_logprobs"
    rendered = call(app, "/v1/chat/completions/render", body)
    assert rendered.status == 200 and rendered.json()["sampling_params"]["logprobs"] == 2


def test_a_constraint_with_logprobs_renders_both_and_the_token_in_route_sends_both() -> None:
    """Both protocol 1.3 additions in one body: the chat route sends both to a vllm engine, render writes
    both, and the token-in route sends what the chat route sent."""
    app = frontend_app(max_model_len=2048, backend="vllm", minor=3)
    body = {"model": "tiny", "messages": HI, "max_tokens": 4, "logprobs": True, "top_logprobs": 2,
            "structured_outputs": {"regex": "[a-z]+"}, "logit_bias": {"11": 2.5}}
    assert call(app, "/v1/chat/completions", body).status == 200
    expected = sent(app).sampling
    assert (expected.regex, expected.logit_bias, expected.logprobs) == ("[a-z]+", {11: 2.5}, 2)
    rendered = call(app, "/v1/chat/completions/render", body).json()
    assert rendered["sampling_params"] == {"max_tokens": 4, "logprobs": 2, "output_kind": 2,
                                           "structured_outputs": {"regex": "[a-z]+"}, "logit_bias": {"11": 2.5}}
    assert call(app, "/inference/v1/generate", rendered).status == 200
    assert sent(app).sampling == expected


# ---- render-only mode ----


@pytest.fixture(scope="module")
def render_only() -> Frontend:
    return render_only_app()


def test_render_only_is_ready_with_no_engine_and_serves_preprocessing(render_only: Frontend) -> None:
    assert call(render_only, "/ready", method="GET").json() == {"ready": True, "render_only": True}
    rendered = call(render_only, "/v1/chat/completions/render", {"model": "tiny", "messages": HI})
    assert rendered.status == 200
    # No engine to ask: the context comes from config.json (4096 for the tiny model), chat's default the rest.
    assert rendered.json()["sampling_params"]["max_tokens"] == 4096 - len(rendered.json()["token_ids"])
    assert call(render_only, "/tokenize", {"prompt": "hi"}).json()["max_model_len"] == 4096
    assert call(render_only, "/v1/models", method="GET").json()["data"][0]["max_model_len"] == 4096
    assert call(render_only, "/version", method="GET").status == 200


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions/render", {"messages": HI}),
                                            ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})])
def test_render_only_knows_no_lora_adapters(render_only: Frontend, path: str, body: dict[str, Any]) -> None:
    answer = call(render_only, path, {**body, "model": "some-adapter"})  # no engines to ask: a 404, not a 503
    assert answer.status == 404 and "The model `some-adapter` does not exist" in answer.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate"])
def test_render_only_does_not_serve_generation(render_only: Frontend, path: str) -> None:
    answer = call(render_only, path, {"model": "tiny", "messages": HI})
    assert answer.status == 404 and "--render-only" in answer.json()["error"]["message"]
    assert path not in call(render_only, "/openapi.json", method="GET").json()["paths"]


def test_render_only_max_model_len_flag() -> None:
    app = render_only_app(max_model_len=32)
    answer = call(app, "/v1/chat/completions/render", {"model": "tiny", "messages": HI, "max_tokens": 30})
    assert answer.status == 400 and answer.json()["error"]["param"] == "max_tokens" and "32" in answer.body.decode()


def test_render_only_flags() -> None:
    config = parse_args(["--model", "tiny", "--render-only"])
    assert config.render_only and config.data_parallel_size_local == 0 and not config.engine_addresses
    assert parse_args(["--model", "tiny", "--render-only", "--max-model-len", "64"]).max_model_len == 64
    for argv in (["--engine-addresses", "tcp://h:1", "--data-parallel-size-local", "0"],
                 ["--data-parallel-size-local", "2"]):
        with pytest.raises(SystemExit):
            parse_args(["--model", "tiny", "--render-only", *argv])
    with pytest.raises(SystemExit):  # with engines, the engines say it
        parse_args(["--model", "tiny", "--max-model-len", "64"])
