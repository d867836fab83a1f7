"""The OpenAI chat and completions APIs (router process): upstream speaks them already, so their
adapters pass requests and answers through; the OpenAI error shape, which the Responses API and the
router's own routes share; and the replay of whole chat/completions chunks as a stream."""
from __future__ import annotations

from typing import Any

import msgspec

from services.router.listeners.codecs.codec import CHAT_PATH, Adapter, AdapterError, StreamTranslator

_json = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                502: "upstream_error", 503: "service_unavailable_error", 504: "timeout_error"}


def openai_error(status: int, message: str, param: str | None = None,
                 code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error body; `code` defaults to the status, as the fleet's frontends answer."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"), "param": param,
                      "code": code if code is not None else status}}


class ChunkStream:
    """Upstream's own chunks as its own SSE: `data:` lines, then [DONE]."""

    __slots__ = ()

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return b"data: " + _json.encode(chunk) + b"\n\n"

    def finish(self) -> bytes:
        return _DONE

    def error(self, message: str) -> bytes:
        """The event that ends a stream which broke off (no [DONE] follows)."""
        return self.feed({"error": {"message": message, "type": "upstream_error", "code": 502}})


def _checked(body: dict[str, Any]) -> None:
    """Upstream serves these APIs itself: the body goes up as the client sent it (but for the model),
    and upstream checks it. What the router reads itself is checked here: the model, and the stream
    options that escalate answers from a whole upstream answer (upstream never sees them then)."""
    if not isinstance(body.get("model"), str):
        raise AdapterError("model", "a model name (string) is required")
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise AdapterError("stream", "must be a boolean")
    if options is not None and not isinstance(options, dict):
        raise AdapterError("stream_options", "must be an object")


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body; its messages' text is what signals read."""
    _checked(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise AdapterError("messages", "must be a list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise AdapterError(f"messages[{i}]", "must be a message object")
        if not isinstance(message.get("role"), str):
            raise AdapterError(f"messages[{i}].role", "must be a string")
        if not isinstance(message.get("content"), (str, list, type(None))):
            raise AdapterError(f"messages[{i}].content", "must be a string, a list of content parts, or null")
    return body


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    """A completions body; its prompt's text is what signals read."""
    _checked(body)
    if not isinstance(body.get("prompt"), (str, list)):
        raise AdapterError("prompt", "must be a string, or a list of token ids or of one string")
    return body


def _as_is(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    return chat


def _chunks(request: dict[str, Any]) -> StreamTranslator:
    return ChunkStream()


CHAT = Adapter("chat", "/v1/chat/completions", _chat, _as_is, _chunks, openai_error,
               upstream_path=CHAT_PATH, passthrough=True)
COMPLETIONS = Adapter("completions", "/v1/completions", _completion, _as_is, _chunks, openai_error,
                      upstream_path="/v1/completions", passthrough=True)
