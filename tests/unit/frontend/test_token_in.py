"""POST /inference/v1/generate (services/frontend/requests/token_in.py and the token-out writers) on the
in-process frontend, whose fake engine answers each request with one token: vLLM's request and
response shapes, what reaches the engine, and every field of vLLM's SamplingParams honoured or
refused with a 400 naming it."""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from protocol import GenerateRequest
from services.frontend.http_api.app import Frontend
from services.frontend.requests import token_in
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import AnsweringBridge, frontend_app

IDS = [9707, 1052, 11]


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app(max_model_len=2048)


def call(app: Frontend, body: Any, headers: dict[str, str] | None = None) -> Answer:
    return asyncio.run(request(app, "POST", "/inference/v1/generate", body, headers=headers))


def sent(app: Frontend) -> GenerateRequest:
    bridge = app.engines._bridge
    assert isinstance(bridge, AnsweringBridge)
    return bridge.requests[-1]


def test_a_whole_answer_is_vllm_s_generate_response(app: Frontend) -> None:
    answer = call(app, {"request_id": "mine-1", "model": "tiny", "token_ids": IDS,
                        "sampling_params": {"max_tokens": 4, "temperature": 0}})
    assert answer.status == 200 and answer.headers["x-data-parallel-rank"] == "0"
    body = answer.json()
    assert set(body) == {"request_id", "model", "created", "choices", "usage", "prompt_logprobs",
                         "kv_transfer_params", "ec_transfer_params"}
    assert body["request_id"] == "mine-1" and body["model"] == "tiny"
    assert body["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": [9707],
                                "routed_experts": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    engine = sent(app)
    assert engine.prompt_token_ids == IDS and engine.sampling.max_tokens == 4 and engine.sampling.temperature == 0
    assert engine.request_id != "mine-1"  # the caller's id may repeat; the engine's may not


def test_text_only_when_asked(app: Frontend) -> None:
    body = {"token_ids": IDS, "sampling_params": {"max_tokens": 1}, "return_text": True}
    assert call(app, body).json()["choices"][0]["text"] == "Hello"
    assert "text" not in call(app, {**body, "return_text": False}).json()["choices"][0]


def test_a_stream_is_vllm_s_chunks_then_usage_and_done(app: Frontend) -> None:
    answer = call(app, {"token_ids": IDS, "sampling_params": {"max_tokens": 2}, "stream": True, "return_text": True,
                        "stream_options": {"include_usage": True}})
    assert answer.status == 200 and answer.headers["content-type"] == "text/event-stream"
    chunk, usage, done = answer.events()
    assert chunk["request_id"].startswith("generate-") and chunk["usage"] is None
    assert chunk["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": [9707],
                                 "routed_experts": None, "text": "Hello"}]
    assert usage == {"request_id": chunk["request_id"], "choices": [],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    assert done == "[DONE]"
    continuous = call(app, {"token_ids": IDS, "sampling_params": {}, "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).events()
    assert continuous[0]["usage"]["completion_tokens"] == 1 and "text" not in continuous[0]["choices"][0]


def test_max_tokens_left_out_is_the_rest_of_the_context(app: Frontend) -> None:
    for sampling in ({}, {"max_tokens": None}):
        assert call(app, {"token_ids": IDS, "sampling_params": sampling}).status == 200
        assert sent(app).sampling.max_tokens == 2048 - len(IDS)


def test_what_reaches_the_engine(app: Frontend) -> None:
    sampling = {"temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "seed": 3, "stop_token_ids": [11],
                "ignore_eos": True, "max_tokens": 8, "min_tokens": 2, "presence_penalty": 0.1,
                "frequency_penalty": 0.2, "repetition_penalty": 1.1, "stop": ["x"], "detokenize": True,
                "skip_special_tokens": False, "spaces_between_special_tokens": True, "output_kind": 2,
                "stream_interval": 4, "flat_logprobs": False, "n": 1}
    answer = call(app, {"token_ids": IDS, "sampling_params": sampling, "cache_salt": "s", "priority": 5,
                        "assistant_tokens_mask": [0, 0, 1], "token_offsets": [[0, 1]]},
                  headers={"X-Data-Parallel-Rank": "0"})
    assert answer.status == 200, answer.body
    engine = sent(app)
    assert (engine.cache_salt, engine.priority, engine.pinned_rank) == ("s", 5, 0)
    s = engine.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.stop_token_ids, s.ignore_eos, s.max_tokens,
            s.min_tokens, s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (
        0.5, 0.9, 0, 0.05, 3, [11], True, 8, 2, 0.1, 0.2, 1.1)


def test_structured_outputs_json_becomes_the_engine_s_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for given in (schema, msgspec.json.encode(schema).decode()):
        sp = msgspec.convert({"structured_outputs": {"json": given}}, token_in.TokenSampling)
        assert msgspec.json.decode(token_in.engine_sampling(sp, 5, 1000).json_schema or "") == schema


def test_structured_outputs_and_logits_controls_reach_vllm_engines() -> None:
    vllm = frontend_app(max_model_len=2048, backend="vllm", minor=3)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}, {"regex": "a+"}),
        ({"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}),
        ({"structured_outputs": {"json_object": True}}, {"json_object": True}),
        ({"logit_bias": {"11": -3}, "allowed_token_ids": [11, 12], "bad_words": ["x"]},
         {"logit_bias": {11: -3.0}, "allowed_token_ids": [11, 12], "bad_words": ["x"]}),
    ]
    for given, expected in cases:
        answer = call(vllm, {"token_ids": IDS, "sampling_params": {"max_tokens": 1, **given}})
        assert answer.status == 200, answer.body
        s = sent(vllm).sampling
        assert {name: getattr(s, name) for name in expected} == expected
    old = frontend_app(max_model_len=2048, backend="vllm", minor=2)  # a JSON Schema needs 1.2, a regex 1.3
    assert call(old, {"token_ids": IDS, "sampling_params": {"structured_outputs": {"json": {}}}}).status == 200
    refused = call(old, {"token_ids": IDS, "sampling_params": {"structured_outputs": {"regex": "a"}}}).json()
    assert refused["error"]["param"] == "sampling_params.structured_outputs.regex", refused


def test_vllm_s_render_output_with_every_default_written_passes(app: Frontend) -> None:
    """What vLLM's own SamplingParams holds at its defaults, written out: accepted."""
    defaults = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": None,
                "stop_token_ids": None, "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None,
                "prompt_logprobs": None, "prompt_logprob_token_ids": None, "prompt_logprob_start": None,
                "logprob_token_ids": None, "flat_logprobs": False, "detokenize": True, "skip_special_tokens": True,
                "spaces_between_special_tokens": True, "include_stop_str_in_output": False, "output_kind": 0,
                "stream_interval": None, "structured_outputs": None, "logit_bias": None, "allowed_token_ids": None,
                "extra_args": None, "bad_words": None, "skip_reading_prefix_cache": None,
                "thinking_token_budget": None, "repetition_detection": None, "routed_experts_prompt_start": 0,
                "trace_decode_token_ids": None}
    body = {"request_id": "r", "token_ids": IDS, "sampling_params": defaults, "model": "tiny", "stream": False,
            "stream_options": None, "cache_salt": None, "priority": 0, "kv_transfer_params": None, "features": None}
    assert call(app, body).status == 200


BAD: list[tuple[dict[str, Any], str]] = [
    ({"sampling_params": {}}, "token_ids"),
    ({"token_ids": IDS}, "sampling_params"),
    ({"token_ids": [], "sampling_params": {}}, "token_ids"),
    ({"token_ids": [1, -1], "sampling_params": {}}, "token_ids[1]"),
    ({"token_ids": [1, 10**9], "sampling_params": {}}, "token_ids[1]"),
    ({"token_ids": [2**70], "sampling_params": {}}, "token_ids[0]"),
    ({"token_ids": ["a"], "sampling_params": {}}, "token_ids[0]"),
    ({"token_ids": IDS * 700, "sampling_params": {}}, "token_ids"),  # past the context
    ({"token_ids": IDS, "sampling_params": {"max_tokens": 3000}}, "sampling_params.max_tokens"),
    ({"token_ids": IDS, "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
    ({"token_ids": IDS, "sampling_params": {"min_tokens": 5, "max_tokens": 2}}, "sampling_params.min_tokens"),
    ({"token_ids": IDS, "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"token_ids": IDS, "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"token_ids": IDS, "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"token_ids": IDS, "sampling_params": {"top_k": -2}}, "sampling_params.top_k"),
    ({"token_ids": IDS, "sampling_params": {"min_p": 2}}, "sampling_params.min_p"),
    ({"token_ids": IDS, "sampling_params": {"repetition_penalty": 0}}, "sampling_params.repetition_penalty"),
    ({"token_ids": IDS, "sampling_params": {"seed": 2**64}}, "sampling_params.seed"),
    ({"token_ids": IDS, "sampling_params": {"stop_token_ids": [10**9]}}, "sampling_params.stop_token_ids[0]"),
    ({"token_ids": IDS, "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
    ({"token_ids": IDS, "sampling_params": {"stop": ["x"] * 65}}, "sampling_params.stop"),
    ({"token_ids": IDS, "sampling_params": {"stop": "x", "detokenize": False}}, "sampling_params.stop"),
    ({"token_ids": IDS, "sampling_params": {"output_kind": 3}}, "sampling_params.output_kind"),
    ({"token_ids": IDS, "sampling_params": {"stream_interval": 0}}, "sampling_params.stream_interval"),
    ({"token_ids": IDS, "sampling_params": {"spaces_between_special_tokens": False}},
     "sampling_params.spaces_between_special_tokens"),
    *[({"token_ids": IDS, "sampling_params": {name: value}}, f"sampling_params.{name}") for name, value in (
        ("logprobs", 21), ("logprobs", -1), ("prompt_logprobs", 21), ("prompt_logprob_token_ids", [1]),
        ("prompt_logprob_start", 0),
        ("logprob_token_ids", [1]),
        # Honoured on vllm engines; this app's engine is a sim.
        ("logit_bias", {"1": 5.0}), ("allowed_token_ids", [1]), ("bad_words", ["x"]),
        ("extra_args", {}), ("thinking_token_budget", 10), ("repetition_detection", {}),
        ("trace_decode_token_ids", [1]), ("truncate_prompt_tokens", 2), ("skip_reading_prefix_cache", True),
        ("routed_experts_prompt_start", 1))],
    # Honoured on vllm engines (the sim refuses them), or (structural_tag "t") not JSON.
    *[({"token_ids": IDS, "sampling_params": {"structured_outputs": {name: value}}},
       f"sampling_params.structured_outputs.{name}") for name, value in (
        ("regex", "a+"), ("choice", ["a"]), ("grammar", "g"), ("json_object", True), ("structural_tag", "t"),
        ("json", {}))],
    ({"token_ids": IDS, "sampling_params": {"structured_outputs": {"json": {}, "whitespace_pattern": " "}}},
     "sampling_params.structured_outputs.whitespace_pattern"),
    ({"token_ids": IDS, "sampling_params": {"structured_outputs": {}}}, "sampling_params.structured_outputs"),
    ({"token_ids": IDS, "sampling_params": {"structured_outputs": {"disable_any_whitespace": True}}},
     "sampling_params.structured_outputs"),
    ({"token_ids": IDS, "sampling_params": {"structured_outputs": {"json": "{nope"}}},
     "sampling_params.structured_outputs.json"),
    ({"token_ids": IDS, "sampling_params": {"structured_outputs": {"json": {"type": 5}}}},
     "sampling_params.structured_outputs.json.type"),
    ({"token_ids": IDS, "sampling_params": {"logit_bias": {"x": 1}}}, "sampling_params.logit_bias"),
    ({"token_ids": IDS, "sampling_params": {"allowed_token_ids": [10**9]}}, "sampling_params.allowed_token_ids[0]"),
    ({"token_ids": IDS, "sampling_params": {"bad_words": [" "]}}, "sampling_params.bad_words[0]"),
    ({"token_ids": IDS, "sampling_params": {"prompt_logprobs": 1}, "stream": True}, "sampling_params.prompt_logprobs"),
    ({"token_ids": IDS, "sampling_params": {}, "features": {}}, "features"),
    ({"token_ids": IDS, "sampling_params": {}, "kv_transfer_params": {}}, "kv_transfer_params"),
    ({"token_ids": IDS, "sampling_params": {}, "ec_transfer_params": {}}, "ec_transfer_params"),
    ({"token_ids": IDS, "sampling_params": {}, "priority": 2**40}, "priority"),
    ({"token_ids": IDS, "sampling_params": {}, "stream": "yes"}, "stream"),
    ({"token_ids": IDS, "sampling_params": {}, "model": "gpt-9"}, "model"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[param + ":" + str(body)[:60] for body, param in BAD])
def test_bad_input_is_refused_naming_the_field(app: Frontend, body: dict[str, Any], param: str) -> None:
    answer = call(app, body)
    assert answer.status == (404 if param == "model" else 400), answer.body
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert param in error["message"] or param == "model" or "maximum context length" in error["message"]


def test_a_bad_pin_header_is_refused(app: Frontend) -> None:
    answer = call(app, {"token_ids": IDS, "sampling_params": {}}, headers={"X-Data-Parallel-Rank": "x"})
    assert answer.status == 400 and answer.json()["error"]["param"] == "X-Data-Parallel-Rank"
