"""The logprobs fields of both request bodies in process, through the ASGI app (a fake bridge answers
each request with one token, "Hello", and the logprobs it asked for, every token ranked first): ranges
against --max-logprobs, vLLM's rules and messages, what reaches the engine, the response shapes, and
engines too old to send logprobs."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol import Ready
from services.frontend.http_api.app import Frontend
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import AnsweringBridge, frontend_app

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny", "messages": HI, "max_tokens": 1}
TEXT = {"model": "tiny", "prompt": "Hello world", "max_tokens": 1}


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app()


def call(app: Frontend, path: str, body: Any) -> Answer:
    return asyncio.run(request(app, "POST", path, body))


def sent(app: Frontend) -> Any:
    bridge = app.engines._bridge
    assert isinstance(bridge, AnsweringBridge)
    return bridge.requests[-1].sampling


@pytest.mark.parametrize(("path", "body", "field", "message"), [
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs=21 is out of range: must be in [0, 20] (the server's --max-logprobs)"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs", "out of range"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs",
     "when using `top_logprobs`, `logprobs` must be set to true."),
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 21}, "prompt_logprobs", "prompt_logprobs=21 is out of range"),
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs",
     "`prompt_logprobs` are not available when `stream=True`."),
    ("/v1/completions", {**TEXT, "logprobs": 21}, "logprobs", "logprobs=21 is out of range"),
    ("/v1/completions", {**TEXT, "prompt_logprobs": 0, "stream": True}, "prompt_logprobs", "not available"),
])
def test_out_of_range_or_against_vllms_rules_is_a_400_naming_the_field(app: Frontend, path: str, body: dict[str, Any],
                                                                       field: str, message: str) -> None:
    answer = call(app, path, body)
    assert answer.status == 400 and answer.json()["error"]["param"] == field
    assert message in answer.json()["error"]["message"]


def test_max_logprobs_sets_the_limit() -> None:
    app = frontend_app(max_logprobs=5)
    assert call(app, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 5}).status == 200
    answer = call(app, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 6})
    assert answer.status == 400 and "[0, 5]" in answer.json()["error"]["message"]


def test_what_the_engine_is_asked_for(app: Frontend) -> None:
    cases: list[tuple[str, dict[str, Any], tuple[int | None, int | None]]] = [
        ("/v1/chat/completions", CHAT, (None, None)),
        ("/v1/chat/completions", {**CHAT, "logprobs": True}, (0, None)),  # top_logprobs absent: 0, as vLLM
        ("/v1/chat/completions", {**CHAT, "logprobs": False, "top_logprobs": 0}, (None, None)),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3, "prompt_logprobs": 2}, (3, 2)),
        ("/v1/completions", {**TEXT, "logprobs": 2}, (2, None)),
        ("/v1/completions", {**TEXT, "logprobs": 2, "echo": True}, (2, 2)),  # echo: the prompt's too
        ("/v1/completions", {**TEXT, "echo": True}, (None, None)),
        ("/v1/completions", {**TEXT, "logprobs": 2, "echo": True, "prompt_logprobs": 0}, (2, 0)),
    ]
    for path, body, expected in cases:
        assert call(app, path, body).status == 200, body
        sampling = sent(app)
        assert (sampling.logprobs, sampling.prompt_logprobs) == expected, body


def test_chat_logprobs_and_prompt_logprobs_in_the_response(app: Frontend) -> None:
    body = call(app, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2, "prompt_logprobs": 1}).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello"
    assert choice["logprobs"] == {"content": [{"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello"),
                                               "top_logprobs": [{"token": "Hello", "logprob": -0.5,
                                                                 "bytes": list(b"Hello")}] * 2}]}
    prompt = body["prompt_logprobs"]
    assert prompt[0] is None and len(prompt) == body["usage"]["prompt_tokens"]
    assert all(len(p) == 1 and next(iter(p.values()))["rank"] == 1 for p in prompt[1:])
    plain = call(app, "/v1/chat/completions", CHAT).json()
    assert plain["choices"][0]["logprobs"] is None and "prompt_logprobs" not in plain


def test_completion_echo_with_logprobs(app: Frontend) -> None:
    body = call(app, "/v1/completions", {**TEXT, "logprobs": 1, "echo": True}).json()
    choice = body["choices"][0]
    assert choice["text"] == "Hello worldHello"
    assert choice["logprobs"]["tokens"] == ["Hello", " world", "Hello"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0, -0.5]
    assert choice["logprobs"]["text_offset"] == [0, 5, 11]
    assert choice["logprobs"]["top_logprobs"] == [None, {" world": -1.0}, {"Hello": -0.5}]
    assert choice["prompt_logprobs"][0] is None  # vLLM's field too, as the engine sent them
    token_prompt = call(app, "/v1/completions", {**TEXT, "prompt": [9707, 1879], "echo": True}).json()
    assert token_prompt["choices"][0]["text"] == "Hello worldHello" and token_prompt["choices"][0]["logprobs"] is None


def test_a_truncated_prompt_echoes_the_tokens_the_model_saw(app: Frontend) -> None:
    """truncate_prompt_tokens with echo: the echoed text is the kept tokens', so that it and the
    prompt's logprobs agree (their tokens join to the text)."""
    body = call(app, "/v1/completions", {**TEXT, "prompt": "one two three", "logprobs": 0, "echo": True,
                                         "truncate_prompt_tokens": 2}).json()
    choice = body["choices"][0]
    assert choice["text"] == " two threeHello" and body["usage"]["prompt_tokens"] == 2
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]


def test_streamed_chunks_carry_their_tokens_logprobs(app: Frontend) -> None:
    import json

    answer = call(app, "/v1/chat/completions", {**CHAT, "logprobs": True, "stream": True})
    chunks = [json.loads(line[6:]) for line in answer.body.decode().split("\n\n") if line.startswith("data: {")]
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        None, {"content": [{"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello"), "top_logprobs": []}]}, None]
    answer = call(app, "/v1/completions", {**TEXT, "logprobs": 0, "stream": True, "return_tokens_as_token_ids": True})
    chunks = [json.loads(line[6:]) for line in answer.body.decode().split("\n\n") if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["logprobs"] == {"text_offset": [0], "token_logprobs": [-0.5],
                                                   "tokens": ["token_id:9707"],
                                                   "top_logprobs": [{"token_id:9707": -0.5}]}


def test_engines_too_old_to_send_logprobs_are_a_400() -> None:
    app = frontend_app()
    engine = app.engines.engines[0]
    app.engines._on_ready(engine, Ready(0, "tiny", 4096, 16, 1000, "vllm", "old", "epoch-2", 0, 1, 2),
                          time.monotonic())
    for path, body, field in (("/v1/chat/completions", {**CHAT, "logprobs": True}, "top_logprobs"),
                              ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1}, "prompt_logprobs"),
                              ("/v1/completions", {**TEXT, "logprobs": 1}, "logprobs")):
        answer = call(app, path, body)
        assert answer.status == 400 and answer.json()["error"]["param"] == field
        assert "engine rank 0 does not (protocol 1.2; 1.3 or newer does)" in answer.json()["error"]["message"]
    assert call(app, "/v1/chat/completions", CHAT).status == 200
