"""POST /tokenize and /detokenize (services/frontend/requests/tokenization.py) on the in-process frontend: vLLM's
shapes, the chat form rendered as the chat route renders it, the round trip, and every bad input a
400 naming the field."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.frontend.http_api.app import Frontend
from services.frontend.model import Model
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import AnsweringBridge, frontend_app

HI = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app(max_model_len=2048)


@pytest.fixture(scope="module")
def model(app: Frontend) -> Model:
    return app.model


def call(app: Frontend, path: str, body: Any) -> Answer:
    return asyncio.run(request(app, "POST", path, body))


def test_the_completion_form_answers_vllm_s_shape(app: Frontend, model: Model) -> None:
    answer = call(app, "/tokenize", {"model": "tiny", "prompt": "hello world", "return_token_strs": True})
    encoding = model.tokenizer.encode("hello world")
    assert answer.status == 200
    assert answer.json() == {"count": len(encoding.ids), "max_model_len": 2048, "tokens": encoding.ids,
                             "token_strs": encoding.tokens}
    plain = call(app, "/tokenize", {"prompt": "hello world"}).json()  # model may be left out, as in vLLM
    assert plain["token_strs"] is None and plain["tokens"] == encoding.ids


def test_the_chat_form_gives_the_prompt_the_chat_route_sends(app: Frontend) -> None:
    bridge = app.engines._bridge
    assert isinstance(bridge, AnsweringBridge)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    for extra in ({}, {"tools": tools}, {"chat_template_kwargs": {"enable_thinking": False}}):
        tokens = call(app, "/tokenize", {"model": "tiny", "messages": HI, **extra}).json()["tokens"]
        choice = {"tool_choice": "none"} if "tools" in extra else {}  # "auto" needs the parser flags
        chat = call(app, "/v1/chat/completions", {"model": "tiny", "messages": HI, "max_tokens": 1, **extra,
                                                  **choice})
        assert chat.status == 200
        assert tokens == bridge.requests[-1].prompt_token_ids
        assert chat.json()["usage"]["prompt_tokens"] == len(tokens)


def test_chat_form_options(app: Frontend, model: Model) -> None:
    with_prompt = call(app, "/tokenize", {"messages": HI}).json()["tokens"]
    without = call(app, "/tokenize", {"messages": HI, "add_generation_prompt": False}).json()["tokens"]
    assert with_prompt[:len(without)] == without and len(with_prompt) > len(without)
    prefill = [*HI, {"role": "assistant", "content": "Sure, here"}]
    cont = call(app, "/tokenize", {"messages": prefill, "add_generation_prompt": False,
                                   "continue_final_message": True}).json()["tokens"]
    assert model.tokenizer.decode(cont, skip_special_tokens=False).endswith("Sure, here")


def test_detokenize_gives_the_text_back(app: Frontend) -> None:
    for text in ("hello world", "Grüße, 世界! 🙂", "  spaced\n\nlines  "):
        tokens = call(app, "/tokenize", {"prompt": text}).json()["tokens"]
        answer = call(app, "/detokenize", {"model": "tiny", "tokens": tokens})
        assert answer.status == 200 and answer.json() == {"prompt": text}


def test_detokenize_keeps_special_tokens_as_vllm(app: Frontend, model: Model) -> None:
    tokens = call(app, "/tokenize", {"messages": HI}).json()["tokens"]
    prompt = call(app, "/detokenize", {"tokens": tokens}).json()["prompt"]
    assert prompt.startswith("<|im_start|>user\nHello there<|im_end|>") and prompt.endswith("<|im_start|>assistant\n")


TEMPLATE_ONLY = {"role": "user", "content": "x"}
BAD = [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "return_token_strs": 1}, 400, "return_token_strs"),
    ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": "hi"}, 400, "messages"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("/tokenize", {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "chat_template": "{{ x }}"}, 400, "chat_template"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "chat_template_kwargs": {"messages": []}}, 400,
     "chat_template_kwargs.messages"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "tools": [{"type": "function"}]}, 400, "tools[0].function"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "mm_processor_kwargs": {}}, 400, "mm_processor_kwargs"),
    ("/tokenize", {"messages": [TEMPLATE_ONLY], "media_io_kwargs": {}}, 400, "media_io_kwargs"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, "a"]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [1, -1]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [2**70]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [1], "model": "gpt-9"}, 404, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD, ids=[f"{p}:{b}" for p, b, _, _ in BAD])
def test_bad_input_is_refused_naming_the_field(app: Frontend, path: str, body: dict[str, Any], status: int,
                                               param: str) -> None:
    answer = call(app, path, body)
    assert answer.status == status, answer.body
    error = answer.json()["error"]
    assert error["param"] == param and param in error["message"], error


def test_non_json_and_non_object_bodies(app: Frontend) -> None:
    for path in ("/tokenize", "/detokenize"):
        assert call(app, path, b"{nope").status == 400
        assert call(app, path, [1, 2]).json()["error"]["message"] == "request body must be a JSON object"
        assert asyncio.run(request(app, "GET", path)).status == 405
