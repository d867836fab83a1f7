"""The OpenAI chat and completions codecs (services/router/listeners/codecs/openai.py) and the registry
that finds every API's codec by name (listeners/codecs/registry.py)."""
from __future__ import annotations

import pytest

from services.router.config import APIS
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.openai import CHAT, COMPLETIONS, openai_error
from services.router.listeners.codecs.registry import CODECS, error_shape


def test_chat_and_completions_pass_through() -> None:
    body = {"model": "m", "messages": [], "whatever": 1}
    assert CHAT.to_chat(body) is body and CHAT.from_chat(body, {}) is body
    assert (CHAT.path, CHAT.upstream_path, COMPLETIONS.path, COMPLETIONS.upstream_path) == (
        "/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/v1/completions")
    assert CHAT.passthrough and COMPLETIONS.passthrough and CHAT.refusal_body(400, b"{}") is None
    with pytest.raises(CodecError, match="model: a model name") as info:
        COMPLETIONS.to_chat({"prompt": "x"})
    assert info.value.param == "model"


def test_replayed_chunks_are_upstreams_own_event_stream() -> None:
    stream = CHAT.stream({})
    assert stream.start() == b""
    assert stream.feed({"a": 1}) == b'data: {"a":1}\n\n' and stream.finish() == b"data: [DONE]\n\n"
    assert stream.error("gone") == b'data: {"error":{"message":"gone","type":"upstream_error","code":502}}\n\n'


def test_the_openai_error_shape() -> None:
    assert openai_error(429, "slow down") == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": 429}}
    assert openai_error(400, "bad", "model") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "model", "code": 400}}
    assert openai_error(418, "teapot")["error"]["type"] == "error"


def test_the_registry_names_every_adapted_api_once() -> None:
    assert list(CODECS) == ["chat", "completions", "responses", "messages", "count_tokens", "images"]
    # Each is a listener API of its own, or another's route (count_tokens is served where messages is).
    assert all((adapter.part_of or name) in APIS and adapter.name == name for name, adapter in CODECS.items())
    assert len({adapter.path for adapter in CODECS.values()}) == len(CODECS)
    assert error_shape("messages") is CODECS["messages"]
    assert error_shape("models") is error_shape(None) is CHAT  # the router's own routes answer as OpenAI
