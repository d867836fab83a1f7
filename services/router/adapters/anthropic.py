"""Anthropic Messages API <-> upstream chat completions, run in the router: request translation, the
message object, the streaming events, error bodies, and the adapter that bundles them. Pure: no I/O,
the dispatcher feeds and sends."""
from __future__ import annotations

import uuid
from typing import Any

import msgspec

from services.router.adapters import (
    Adapter,
    AdapterError,
    ask_stream,
    checked_model,
    text_parts,
)

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
_STOP_REASONS = {"length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error", 409: "conflict_error",
                413: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
                # No replica free is what Anthropic calls overloaded (its own status for that is 529).
                503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request body as a chat completions body; AdapterError names what cannot be carried."""
    model = checked_model(body, _refuse_unsupported)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise AdapterError("max_tokens", "is required: an integer >= 1")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None and system != "":
        messages.append({"role": "system", "content": _content(system, "system")})
    messages.extend(_messages(body.get("messages")))
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if messages[-1]["role"] == "assistant":
        # A final assistant turn is a prefill: the model continues it rather than starting a new turn.
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise AdapterError(name, f"must be a number in [{low}, {high}]")
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise AdapterError("top_k", "must be an integer >= 0")
        if top_k > 0:  # Anthropic's 0 and chat's absent both mean "no top-k"
            chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise AdapterError("stop_sequences", "must be a list of non-empty strings")
        if stops:
            chat["stop"] = stops
    ask_stream(body, chat)
    return chat


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields that would change the answer if dropped silently; metadata, service_tier and the like are ignored."""
    if body.get("tools"):
        raise AdapterError("tools", "tools are not supported by this server")
    choice = body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict) or choice.get("type") not in ("auto", "none")):
        raise AdapterError("tool_choice", "only {'type': 'auto'} and {'type': 'none'} are supported (no tools)")
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") != "disabled"):
        raise AdapterError("thinking", "extended thinking is not supported by this server")
    for name in ("mcp_servers", "container", "output_format"):
        if body.get(name):
            raise AdapterError(name, "is not supported by this server")
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format"):
        raise AdapterError("output_config.format", "structured outputs are not supported by this server")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise AdapterError("messages", "is required: a non-empty list of messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise AdapterError(where, "must be a message object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise AdapterError(f"{where}.role", "must be 'user' or 'assistant'")
        out.append({"role": role, "content": _content(message.get("content"), f"{where}.content")})
    return out


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    # cache_control and citations are dropped: prefix caching upstream is automatic.
    return text_parts(content, where, ("text",), "content block")


def chat_to_message(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion as an Anthropic `message` object."""
    choice = (chat.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"), request)
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": request.get("model") or chat.get("model", ""),
            # Anthropic answers an empty completion with no blocks, not an empty text block.
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": _usage(chat.get("usage")) or {"input_tokens": 0, "output_tokens": 0}}


def _stop(finish_reason: str | None, matched: Any, request: dict[str, Any]) -> tuple[str, str | None]:
    """Upstream names a matched stop string in `stop_reason` (a token id when an EOS token stopped it)."""
    if finish_reason == "stop" and isinstance(matched, str):
        stops = request.get("stop_sequences")
        if not stops or matched in stops:
            return "stop_sequence", matched
    return _STOP_REASONS.get(finish_reason or "", "end_turn"), None


def _usage(chat_usage: dict[str, Any] | None) -> dict[str, int] | None:
    if not chat_usage:
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    # Anthropic's input_tokens excludes cache reads: the prompt is input + cache read + cache creation.
    return {"input_tokens": prompt - cached, "output_tokens": chat_usage.get("completion_tokens") or 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP status."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesStream:
    """One streamed message: chat chunk dicts in, Anthropic SSE events out (`event:` + `data:` lines).

    Call start() once, feed() per upstream chunk, then finish() at upstream's [DONE] or error() on a
    failure; after either end, further calls return b"".
    """

    __slots__ = ("_ended", "_finish", "_id", "_matched", "_request", "_usage")

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._id = f"msg_{uuid.uuid4().hex}"
        self._finish: str | None = None
        self._matched: Any = None
        self._usage: dict[str, Any] | None = None
        self._ended = False

    def start(self, input_tokens: int | None = None) -> bytes:
        """input_tokens may be unknown until upstream's usage chunk; message_delta then carries it."""
        message = {"id": self._id, "type": "message", "role": "assistant", "model": self._request.get("model", ""),
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": input_tokens or 0, "output_tokens": 0}}
        return b"".join((_event("message_start", {"type": "message_start", "message": message}),
                         _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                        "content_block": {"type": "text", "text": ""}}),
                         _event("ping", {"type": "ping"})))

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One parsed upstream chunk; an upstream error chunk ends the stream with an error event."""
        if self._ended:
            return b""
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            code = err.get("code")
            kind = anthropic_error(code, "")["error"]["type"] if isinstance(code, int) else "api_error"
            return self.error(err.get("message") or "upstream error", kind)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out = b""
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                out += _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                      "delta": {"type": "text_delta", "text": piece}})
            if choice.get("finish_reason"):
                self._finish, self._matched = choice["finish_reason"], choice.get("stop_reason")
        return out

    def finish(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        stop_reason, stop_sequence = _stop(self._finish, self._matched, self._request)
        # Usage on message_delta is cumulative and overwrites message_start's, so a late count lands.
        usage = _usage(self._usage) or {"output_tokens": 0}
        return b"".join((_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
                         _event("message_delta", {"type": "message_delta", "usage": usage,
                                                  "delta": {"stop_reason": stop_reason,
                                                            "stop_sequence": stop_sequence}}),
                         _event("message_stop", {"type": "message_stop"})))

    def error(self, message: str, kind: str = "api_error") -> bytes:
        """An `error` event of Anthropic's error `kind` (its `type` field)."""
        if self._ended:
            return b""
        self._ended = True
        return _event("error", {"type": "error", "error": {"type": kind, "message": message}})


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _refusal_body(status: int, raw: bytes) -> bytes:
    """Every error in Anthropic's shape, upstream's 4xx (OpenAI's shape) too."""
    try:
        message = _decode.decode(raw)["error"]["message"]
    except (msgspec.DecodeError, KeyError, TypeError):
        message = raw[:500].decode(errors="replace")
    return _json.encode(anthropic_error(status, message))


MESSAGES = Adapter("messages", "/v1/messages", messages_to_chat, chat_to_message, MessagesStream,
                   lambda status, message, param, code: anthropic_error(status, message), _refusal_body)
