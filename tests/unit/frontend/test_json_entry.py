"""Every JSON body through one entry (requests/json_body.py), in process through the frontend's ASGI
app (a fake bridge behind it): every POST route answers a body nested 1,000 deep with a 400 (the
routes are read off the app, so a new one is covered); the /tokenize and /detokenize forms refuse
unknown fields; whole-number floats in integer fields are those integers, a fraction a 400; a lone
surrogate escape is U+FFFD; NaN and Infinity are 400s naming the field."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from services.frontend.http_api.app import Frontend
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import AnsweringBridge, frontend_app

HI = [{"role": "user", "content": "hi"}]
DEEP = b"[" * 1000 + b"]" * 1000


@pytest.fixture(scope="module")
def app() -> Frontend:
    app = frontend_app()
    app.config = replace(app.config, allow_runtime_lora_updating=True)  # so the LoRA routes read their bodies
    return app


def call(app: Frontend, path: str, body: Any) -> Answer:
    return asyncio.run(request(app, "POST", path, body))


def post_routes(app: Frontend) -> list[str]:
    starlette = [r.path for r in app.starlette.routes if "POST" in (getattr(r, "methods", None) or ())]
    return sorted({*app._lean, *app._preprocess, *starlette})


def test_the_routes_read_off_the_app_are_every_post_route() -> None:
    assert post_routes(frontend_app()) == [
        "/detokenize", "/inference/v1/generate", "/tokenize", "/v1/chat/completions", "/v1/chat/completions/render",
        "/v1/completions", "/v1/completions/render", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]


@pytest.mark.parametrize("field", ["model", "prompt", "messages", "tokens", "lora_name"])
def test_every_post_route_answers_a_body_nested_too_deeply_with_a_400(app: Frontend, field: str) -> None:
    body = b'{"' + field.encode() + b'": ' + DEEP + b"}"
    for path in post_routes(app):
        answer = call(app, path, body)
        assert answer.status == 400, (path, answer.body)
        assert "nests too deeply" in answer.json()["error"]["message"], (path, answer.body)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "bogus": 1}, "bogus"),
    ({"messages": HI, "bogus": 1}, "bogus"),
    ({"messages": HI, "prompt": "hi"}, "prompt"),  # the chat form has no prompt
])
def test_tokenize_refuses_unknown_fields_in_either_form(app: Frontend, body: dict[str, Any], param: str) -> None:
    answer = call(app, "/tokenize", body)
    assert answer.status == 400 and answer.json()["error"]["param"] == param, answer.body


def test_detokenize_refuses_unknown_fields(app: Frontend) -> None:
    answer = call(app, "/detokenize", {"tokens": [1], "bogus": 1})
    assert answer.status == 400 and answer.json()["error"]["param"] == "bogus", answer.body


def _sent(app: Frontend) -> Any:
    bridge = app.engines._bridge
    assert isinstance(bridge, AnsweringBridge)
    return bridge.requests[-1]


def test_whole_number_floats_in_integer_fields_are_those_integers(app: Frontend) -> None:
    answer = call(app, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 5.0, "seed": 7.0,
                                           "stop_token_ids": [2.0, 3, 4.0], "n": 1.0, "temperature": 1})
    assert answer.status == 200, answer.body
    sampling = _sent(app).sampling
    assert (sampling.max_tokens, sampling.seed, sampling.stop_token_ids) == (5, 7, [2, 3, 4])
    assert type(sampling.max_tokens) is int and all(type(t) is int for t in sampling.stop_token_ids)
    answer = call(app, "/v1/chat/completions", {"model": "tiny", "messages": HI, "max_completion_tokens": 3e0})
    assert answer.status == 200 and _sent(app).sampling.max_tokens == 3, answer.body
    answer = call(app, "/inference/v1/generate", {"model": "tiny", "token_ids": [1.0, 2.0],
                                                   "sampling_params": {"max_tokens": 2.0}})
    assert answer.status == 200, answer.body
    assert list(_sent(app).prompt_token_ids) == [1, 2] and _sent(app).sampling.max_tokens == 2
    assert call(app, "/detokenize", {"tokens": [9707.0]}).json() == call(app, "/detokenize", {"tokens": [9707]}).json()
    # A completion prompt of token ids (typed by hand: its union takes any list), alone or in a batch.
    for prompt in ([1.0, 2.0], [[1.0, 2.0]]):
        answer = call(app, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
        assert answer.status == 200 and list(_sent(app).prompt_token_ids) == [1, 2], answer.body
    answer = call(app, "/v1/completions", {"model": "tiny", "prompt": [1.0, 2.5], "max_tokens": 1})
    assert answer.status == 400 and answer.json()["error"]["param"] == "prompt", answer.body


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 5.5}, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 5.0, "seed": 1.5}, "seed"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "stop_token_ids": [2.0, 3.5]}, "stop_token_ids[1]"),
    ("/v1/chat/completions", {"model": "tiny", "messages": HI, "top_logprobs": 0.5}, "top_logprobs"),
    ("/inference/v1/generate", {"token_ids": [1.0, 2.5], "sampling_params": {}}, "token_ids[1]"),
])
def test_a_fraction_in_an_integer_field_is_a_400_naming_it(app: Frontend, path: str, body: Any, param: str) -> None:
    answer = call(app, path, body)
    assert answer.status == 400 and answer.json()["error"]["param"] == param, answer.body


def test_a_lone_surrogate_is_the_replacement_character(app: Frontend) -> None:
    for raw in (b'{"prompt": "caf\\ud83d"}', b'{"prompt": "caf\\udc00"}'):
        assert call(app, "/tokenize", raw).json()["tokens"] == call(app, "/tokenize", {"prompt": "caf\ufffd"}).json()[
            "tokens"]
    answer = call(app, "/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", '
                                               b'"content": "cut \\ud83d"}], "max_tokens": 1}')
    assert answer.status == 200, answer.body
    answer = call(app, "/v1/completions",
                  b'{"model": "tiny", "prompt": "\\ud83d\\ude00 and \\\\ud800", "max_tokens": 1}')
    assert answer.status == 200, answer.body
    tokens = call(app, "/tokenize", {"prompt": "\U0001f600 and \\ud800"}).json()["tokens"]
    assert list(_sent(app).prompt_token_ids) == tokens  # a pair and an escaped backslash are what they were


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "top_p": Infinity}', "top_p"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                             b'"logit_bias": {"5": -Infinity}}', "logit_bias.5"),
    ("/inference/v1/generate", b'{"token_ids": [1], "sampling_params": {"min_p": NaN}}', "sampling_params.min_p"),
    ("/tokenize", b'{"prompt": NaN}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "temperature": 1e400}', "temperature"),  # past a float
])
def test_nan_and_infinity_are_400s_naming_the_field(app: Frontend, path: str, raw: bytes, param: str) -> None:
    answer = call(app, path, raw)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error


@pytest.mark.parametrize(("tail", "param"), [
    (b'"content": "cut \\ud83d"}]', None),  # mended, then the whole-number float read
    (b'"content": "x"}], "temperature": NaN', "temperature"),
    (b'"content": "x"}], "temperature": 1e400', "temperature"),
])
def test_a_whole_number_float_before_another_lenient_reading_is_read_as_either_alone(
        app: Frontend, tail: bytes, param: str | None) -> None:
    """The strict decode stops at the first float; what follows it still gets its own reading (a 500 when
    the whole-number mending decoded the rest without it)."""
    answer = call(app, "/v1/chat/completions",
                  b'{"model": "tiny", "max_tokens": 5.0, "messages": [{"role": "user", ' + tail + b"}")
    if param is None:
        assert answer.status == 200, answer.body
        assert _sent(app).sampling.max_tokens == 5
    else:
        assert answer.status == 400, answer.body
        assert answer.json()["error"]["param"] == param
