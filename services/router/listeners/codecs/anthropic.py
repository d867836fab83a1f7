"""Anthropic Messages API <-> upstream chat completions, run in the router: the message object (thinking,
text and tool_use blocks), the streaming events, error bodies, and the codec that bundles them with
the request translation (anthropic_request.py). Pure: no I/O, the relay (listeners/relay.py) feeds and sends."""
from __future__ import annotations

import uuid
from typing import Any

import msgspec

from services.router.listeners.codecs.anthropic_request import RENAMES, messages_to_chat
from services.router.listeners.codecs.codec import Codec, answer_calls, call_deltas, reasoning_of
from services.router.listeners.codecs.request_fields import renamed_message

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
_STOP_REASONS = {"length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error", 409: "conflict_error",
                413: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
                # No replica free is what Anthropic calls overloaded (its own status for that is 529).
                503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def chat_to_message(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion as an Anthropic `message` object: blocks in the order thinking,
    text, tool_use."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reasoning = reasoning_of(message) if thinks(request) else ""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append(_thinking_block(reasoning))
    # Anthropic answers an empty completion with no blocks, not an empty text block.
    if text:
        content.append({"type": "text", "text": text})
    content.extend(_tool_use_block(call_id, name, tool_input(arguments))
                   for call_id, name, arguments in answer_calls(message))
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"), request)
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": request.get("model") or chat.get("model", ""), "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": _usage(chat.get("usage")) or {"input_tokens": 0, "output_tokens": 0}}


def thinks(request: dict[str, Any]) -> bool:
    """Whether the client enabled thinking: only then are thinking blocks answered, as Anthropic does, so a
    client that reads content[0] as text still finds text when the upstream model reasons unasked."""
    thinking = request.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "enabled"


def _thinking_block(thinking: str) -> dict[str, Any]:
    # The SDK's ThinkingBlock requires a signature; nothing here signs thinking, so it is empty.
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def _tool_use_block(call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool_use input. No arguments is {}; arguments that are no JSON object
    (a model's malformed call) are kept whole under "_raw_arguments", so the client sees what the model
    wrote rather than a 502 for a reply the replica served correctly."""
    if not arguments.strip():
        return {}
    try:
        value = _decode.decode(arguments)
    except msgspec.DecodeError:
        value = None
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}


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

    Content blocks open when their first delta arrives and close when the next opens, one at a time as
    Anthropic sends them: thinking (upstream's reasoning deltas, when the client enabled thinking), text
    (content deltas), one tool_use per upstream tool call, whose argument fragments go out as they are
    as input_json_delta. The ping follows the first block's start, as Anthropic's does.
    Call start() once, feed() per upstream chunk, then finish() at upstream's [DONE] or error() on a
    failure; after either end, further calls return b"".
    """

    __slots__ = ("_blocks", "_calls", "_ended", "_finish", "_id", "_kind", "_matched", "_request", "_thinks",
                 "_usage")

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._thinks = thinks(request)
        self._id = f"msg_{uuid.uuid4().hex}"
        self._blocks = 0  # blocks opened so far; the open one, if any, is the last
        self._kind: str | None = None  # of the open block: thinking, text or tool_use
        self._calls: dict[int, int] = {}  # upstream's tool call index -> its block's index
        self._finish: str | None = None
        self._matched: Any = None
        self._usage: dict[str, Any] | None = None
        self._ended = False

    def start(self, input_tokens: int | None = None) -> bytes:
        """input_tokens may be unknown until upstream's usage chunk; message_delta then carries it."""
        message = {"id": self._id, "type": "message", "role": "assistant", "model": self._request.get("model", ""),
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": input_tokens or 0, "output_tokens": 0}}
        return _event("message_start", {"type": "message_start", "message": message})

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
            delta = choice.get("delta") or {}
            reasoning = reasoning_of(delta) if self._thinks else ""
            if reasoning:
                out += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
            piece = delta.get("content")
            if piece:
                out += self._delta("text", {"type": "text_delta", "text": piece})
            for index, call_id, name, fragment in call_deltas(delta):
                out += self._call(index, call_id, name, fragment)
            if choice.get("finish_reason"):
                self._finish, self._matched = choice["finish_reason"], choice.get("stop_reason")
        return out

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        out = b""
        if self._kind != kind:
            out += self._open(kind, {"type": "text", "text": ""} if kind == "text" else _thinking_block(""))
        return out + _event("content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1,
                                                    "delta": delta})

    def _call(self, index: int, call_id: str | None, name: str | None, fragment: str) -> bytes:
        out = b""
        block = self._calls.get(index)
        if block is None:
            out += self._open("tool_use", _tool_use_block(call_id or f"toolu_{uuid.uuid4().hex[:24]}", name or "", {}))
            block = self._calls[index] = self._blocks - 1
        if fragment:
            # A fragment of a call whose block a later one closed (upstream interleaving calls, which
            # vLLM does not) still goes out at its own block's index.
            out += _event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                  "delta": {"type": "input_json_delta", "partial_json": fragment}})
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        out += _event("content_block_start", {"type": "content_block_start", "index": self._blocks,
                                              "content_block": block})
        if self._blocks == 0:
            out += _PING
        self._blocks += 1
        self._kind = kind
        return out

    def _close(self) -> bytes:
        kind, self._kind = self._kind, None
        if kind is None:
            return b""
        out = b""
        if kind == "thinking":  # Anthropic signs thinking before its block stops; here the signature is empty
            out = _event("content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1,
                                                 "delta": {"type": "signature_delta", "signature": ""}})
        return out + _event("content_block_stop", {"type": "content_block_stop", "index": self._blocks - 1})

    def finish(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        stop_reason, stop_sequence = _stop(self._finish, self._matched, self._request)
        # Usage on message_delta is cumulative and overwrites message_start's, so a late count lands.
        usage = _usage(self._usage) or {"output_tokens": 0}
        return b"".join((self._close() if self._blocks else _PING,
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


_PING = _event("ping", {"type": "ping"})


def refusal_body(status: int, raw: bytes) -> bytes:
    """Every error in Anthropic's shape, upstream's 4xx (OpenAI's shape) too, the chat field it names
    as the client sent it (stop_sequences, not stop), leading the message as this API's errors do."""
    try:
        error = _decode.decode(raw)["error"]
        message, param = error["message"], error.get("param")
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
        message, param = raw[:500].decode(errors="replace"), None
    if not isinstance(message, str):
        message = str(message)
    message = renamed_message(message, RENAMES)
    if param in RENAMES and not message.startswith(RENAMES[param]):
        message = f"{RENAMES[param]}: {message}"
    return _json.encode(anthropic_error(status, message))


MESSAGES = Codec("messages", "/v1/messages", messages_to_chat, chat_to_message, MessagesStream,
                   lambda status, message, param: anthropic_error(status, message), refusal_body,
                   bulk=("messages", "system"))
