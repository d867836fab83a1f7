"""The OpenAI chat and completions APIs (router process): upstream speaks them already, so their
codecs pass requests and answers through; the OpenAI error shape, which the Responses API and the
router's own routes share; and the replay of a whole chat/completions answer as a stream's chunks
(`as_chunks`, for escalate, whose stages answer whole)."""
from __future__ import annotations

from typing import Any

import msgspec

from services.router.listeners.codecs.codec import CHAT_PATH, Codec, CodecError, StreamTranslator

_json = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error",
                502: "upstream_error", 503: "service_unavailable_error", 504: "timeout_error"}


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body with the status as its integer `code`, as vLLM and the fleet's frontend answer."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"), "param": param,
                      "code": status}}


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


def as_chunks(completion: dict[str, Any], *, chat: bool, include_usage: bool) -> list[dict[str, Any]]:
    """A non-streamed chat or completions body as the chunks a stream of it would have carried."""
    base = {"id": completion.get("id", ""), "created": completion.get("created", 0),
            "model": completion.get("model", ""),
            "object": "chat.completion.chunk" if chat else "text_completion"}
    chunks: list[dict[str, Any]] = []
    for i, choice in enumerate(completion.get("choices") or ()):
        index = choice.get("index", i)
        if chat:
            message = choice.get("message") or {}
            for delta in _deltas(message):
                chunks.append({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
            chunks.append({**base, "choices": [{"index": index, "delta": {},
                                                "finish_reason": choice.get("finish_reason")}]})
        else:
            chunks.append({**base, "choices": [{"index": index, "text": choice.get("text") or "",
                                                "finish_reason": choice.get("finish_reason")}]})
    if include_usage and completion.get("usage"):
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks


def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole message as a stream's deltas, in the order a stream sends them: reasoning, content,
    then each tool call whole (its first delta, with all its arguments)."""
    role = message.get("role", "assistant")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    if not reasoning and not calls:
        return [{"role": role, "content": message.get("content") or ""}]
    deltas: list[dict[str, Any]] = []
    if reasoning:
        deltas.append({"role": role, "reasoning_content": reasoning})
    if message.get("content") or not deltas:
        deltas.append({"content": message.get("content") or "", **({} if deltas else {"role": role})})
    deltas.extend({"tool_calls": [{"index": j, **call}]} for j, call in enumerate(calls))
    return deltas


def _checked(body: dict[str, Any]) -> None:
    """Upstream serves these APIs itself: the body goes up as the client sent it (but for the model),
    and upstream checks it. What the router reads itself is checked here: the model, and the stream
    options that escalate answers from a whole upstream answer (upstream never sees them then)."""
    if not isinstance(body.get("model"), str):
        raise CodecError("model", "a model name (string) is required")
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise CodecError("stream", "must be a boolean")
    if options is not None and not isinstance(options, dict):
        raise CodecError("stream_options", "must be an object")


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body; its messages' text is what signals read."""
    _checked(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise CodecError("messages", "must be a list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise CodecError(f"messages[{i}]", "must be a message object")
        if not isinstance(message.get("role"), str):
            raise CodecError(f"messages[{i}].role", "must be a string")
        if not isinstance(message.get("content"), (str, list, type(None))):
            raise CodecError(f"messages[{i}].content", "must be a string, a list of content parts, or null")
    return body


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    """A completions body; its prompt's text is what signals read."""
    _checked(body)
    if not isinstance(body.get("prompt"), (str, list)):
        raise CodecError("prompt", "must be a string, or a list of token ids or of one string")
    return body


def _as_is(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    return chat


def _chunks(request: dict[str, Any]) -> StreamTranslator:
    return ChunkStream()


CHAT = Codec("chat", "/v1/chat/completions", _chat, _as_is, _chunks, openai_error,
               upstream_path=CHAT_PATH, passthrough=True, bulk=("messages",))
COMPLETIONS = Codec("completions", "/v1/completions", _completion, _as_is, _chunks, openai_error,
                      upstream_path="/v1/completions", passthrough=True, bulk=("prompt",))
