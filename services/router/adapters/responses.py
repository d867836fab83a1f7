"""OpenAI Responses API <-> upstream chat completions, run in the router: request translation, the
response object, the streaming events, and the adapter that bundles them. Pure: no I/O, the
dispatcher feeds and sends."""
from __future__ import annotations

import time
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
from services.router.adapters.openai import openai_error

_json = msgspec.json.Encoder()
_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          # Most chat templates know no "developer" role; it means what "system" means there.
          "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body as a chat completions body; AdapterError names what cannot be carried."""
    model = checked_model(body, _refuse_unsupported)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise AdapterError("instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    chat: dict[str, Any] = {"model": model, "messages": messages}
    max_out = body.get("max_output_tokens")
    if max_out is not None:
        if isinstance(max_out, bool) or not isinstance(max_out, int) or max_out < 1:
            raise AdapterError("max_output_tokens", "must be an integer >= 1")
        chat["max_tokens"] = max_out
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise AdapterError(name, "must be a number")
            chat[name] = value
    ask_stream(body, chat)
    return chat


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields that would change the answer if dropped silently; metadata, store, user and the like are ignored."""
    if body.get("tools"):
        raise AdapterError("tools", "tools are not supported by this server")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise AdapterError("tool_choice", "only 'auto' and 'none' are supported (no tools)")
    for name in ("previous_response_id", "conversation", "prompt"):
        if body.get(name):
            raise AdapterError(name, "is not supported: this server stores no responses, conversations or prompts")
    if body.get("reasoning"):
        raise AdapterError("reasoning", "reasoning options are not supported by this server")
    if body.get("background"):
        raise AdapterError("background", "background responses are not supported by this server")
    if body.get("truncation") not in (None, "disabled"):
        raise AdapterError("truncation", "only 'disabled' is supported")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
            raise AdapterError("text.format", "only {'type': 'text'} is supported")


def _input_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise AdapterError("input", "must be a string or a non-empty list of messages")
    messages = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise AdapterError(where, "must be a message object")
        kind = item.get("type", "message")
        if kind != "message":
            raise AdapterError(f"{where}.type", f"input items of type {kind!r} are not supported; only messages")
        role = item.get("role")
        role = _ROLES.get(role) if isinstance(role, str) else None
        if role is None:
            raise AdapterError(f"{where}.role", f"must be one of {sorted(_ROLES)}")
        messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    return messages


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    return text_parts(content, where, _TEXT_PARTS, "content part")


def chat_to_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion as a Responses `response` object echoing the request's settings."""
    choice = (chat.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    status, details = _status(choice.get("finish_reason"))
    item = _message_item(f"msg_{uuid.uuid4().hex}", status, text)
    return _response(f"resp_{uuid.uuid4().hex}", chat.get("created") or int(time.time()), request,
                     model=chat.get("model") or request.get("model", ""), status=status, output=[item],
                     usage=_usage(chat.get("usage")), incomplete_details=details)


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
            # Prefix caching here is automatic: reads are counted, nothing is ever written on request.
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def _response(resp_id: str, created_at: int, request: dict[str, Any], *, model: str, status: str,
              output: list[dict[str, Any]], usage: dict[str, Any] | None,
              incomplete_details: dict[str, str] | None = None,
              error: dict[str, Any] | None = None) -> dict[str, Any]:
    # The SDK's Response model requires parallel_tool_calls, tool_choice and tools; the rest is the
    # request echoed back as OpenAI does, with its defaults where the client sent nothing.
    tool_choice = request.get("tool_choice")
    return {
        "id": resp_id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error, "incomplete_details": incomplete_details,
        "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
        "model": model, "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None, "reasoning": None,
        "temperature": request.get("temperature", 1.0), "top_p": request.get("top_p", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": tool_choice if isinstance(tool_choice, str) else "auto", "tools": [],
        "truncation": "disabled", "usage": usage, "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


class ResponsesStream:
    """One streamed response: chat chunk dicts in, Responses SSE events out (`event:` + `data:` lines).

    Call start() once, feed() per upstream chunk, then finish() at upstream's [DONE] or error() on a
    failure; after either end, further calls return b"".
    """

    __slots__ = ("_created", "_ended", "_finish", "_id", "_item_id", "_pieces", "_request", "_seq", "_started",
                 "_usage")

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._id, self._item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._seq = 0
        self._pieces: list[str] = []
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._started = self._ended = False

    def start(self) -> bytes:
        self._started = True
        snapshot = self._snapshot("in_progress", [])
        item = _message_item(self._item_id, "in_progress", None)
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return b"".join((self._event("response.created", response=snapshot),
                         self._event("response.in_progress", response=snapshot),
                         self._event("response.output_item.added", output_index=0, item=item),
                         self._event("response.content_part.added", **where, part=_text_part(""))))

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One parsed upstream chunk; an upstream error chunk ends the stream as failed."""
        if self._ended:
            return b""
        if "error" in chunk:
            err = chunk["error"]
            return self.error(err.get("message") if isinstance(err, dict) else str(err))
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out = b""
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                self._pieces.append(piece)
                out += self._event("response.output_text.delta", item_id=self._item_id, output_index=0,
                                   content_index=0, delta=piece, logprobs=[])
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def finish(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        text = "".join(self._pieces)
        status, details = _status(self._finish)
        item = _message_item(self._item_id, status, text)
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        final = self._snapshot(status, [item], usage=_usage(self._usage), incomplete_details=details)
        return b"".join((self._event("response.output_text.done", **where, text=text, logprobs=[]),
                         self._event("response.content_part.done", **where, part=_text_part(text)),
                         self._event("response.output_item.done", output_index=0, item=item),
                         self._event(f"response.{status}", response=final)))

    def error(self, message: str | None) -> bytes:
        """An `error` event, then `response.failed` when the response had started."""
        if self._ended:
            return b""
        self._ended = True
        out = self._event("error", code="server_error", message=message, param=None)
        if self._started:
            item = _message_item(self._item_id, "incomplete", "".join(self._pieces))
            failed = self._snapshot("failed", [item], usage=_usage(self._usage),
                                    error={"code": "server_error", "message": message})
            out += self._event("response.failed", response=failed)
        return out

    def _snapshot(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                  **extra: Any) -> dict[str, Any]:
        return _response(self._id, self._created, self._request, model=self._request.get("model", ""),
                         status=status, output=output, usage=usage, **extra)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = _json.encode({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


# Errors in OpenAI's shape; upstream's own 4xx bodies are passed on as they are.
RESPONSES = Adapter("responses", "/v1/responses", responses_to_chat, chat_to_response, ResponsesStream, openai_error)
