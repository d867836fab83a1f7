"""OpenAI Responses API <-> upstream chat completions, run in the router: the response object (reasoning,
message and function call items), the streaming events, and the codec that bundles them with the
request translation (responses_request.py). Pure: no I/O, the relay (listeners/relay.py) feeds and sends."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.router.listeners.codecs.codec import Codec, answer_calls, call_deltas, reasoning_of
from services.router.listeners.codecs.openai import openai_error
from services.router.listeners.codecs.request_fields import renamed_refusal
from services.router.listeners.codecs.responses_request import RENAMES, responses_to_chat, wants_logprobs

_json = msgspec.json.Encoder()
# The response's id when the router chose it up front (listeners/responses_api.py sets it in the request it
# hands these translations, after the codec checked the client's: a client's `id` is an unknown field), so
# that the response it stores has the id the client saw. Absent: a fresh one.
CHOSEN_ID = "id"


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def chat_to_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion as a Responses `response` object echoing the request's settings:
    output items in the order reasoning, message (when there is text, or nothing else), function calls."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reasoning = reasoning_of(message)
    calls = answer_calls(message)
    status, details = _status(choice.get("finish_reason"))
    with_message = bool(text) or not reasoning and not calls
    # As a stream tells it: an item that another followed was completed; the last (all the calls, which
    # stay open to the end) carry the answer's status.
    output = []
    if reasoning:
        output.append(_reasoning_item(f"rs_{uuid.uuid4().hex}", "completed" if with_message or calls else status,
                                      reasoning))
    if with_message:
        logprobs = _logprobs(choice.get("logprobs")) if wants_logprobs(request) else []
        output.append(_message_item(f"msg_{uuid.uuid4().hex}", "completed" if calls else status, text, logprobs))
    output.extend(_call_item(f"fc_{uuid.uuid4().hex}", status, *call) for call in calls)
    return _response(request.get(CHOSEN_ID) or response_id(), chat.get("created") or int(time.time()), request,
                     model=chat.get("model") or request.get("model", ""), status=status, output=output,
                     usage=_usage(chat.get("usage")), incomplete_details=details)


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _message_item(item_id: str, status: str, text: str | None,
                  logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _logprobs(chat_logprobs: Any) -> list[dict[str, Any]]:
    """Upstream chat's choice (or delta) logprobs as output_text's: one {token, logprob, bytes,
    top_logprobs} per token, the shape both APIs share."""
    content = chat_logprobs.get("content") if isinstance(chat_logprobs, dict) else None
    return [{"token": entry.get("token", ""), "logprob": entry.get("logprob", 0.0), "bytes": entry.get("bytes"),
             "top_logprobs": [{"token": top.get("token", ""), "logprob": top.get("logprob", 0.0),
                               "bytes": top.get("bytes")} for top in entry.get("top_logprobs") or ()]}
            for entry in content or ()]


def _reasoning_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_reasoning_part(text)]
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _call_item(item_id: str, status: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def _usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
            # Prefix caching here is automatic: reads are counted, nothing is ever written on request.
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            # Upstream's chat usage does not count reasoning tokens apart.
            "output_tokens_details": {"reasoning_tokens": 0}}


def _response(resp_id: str, created_at: int, request: dict[str, Any], *, model: str, status: str,
              output: list[dict[str, Any]], usage: dict[str, Any] | None,
              incomplete_details: dict[str, str] | None = None,
              error: dict[str, Any] | None = None) -> dict[str, Any]:
    # The SDK's Response model requires parallel_tool_calls, tool_choice and tools; the rest is the
    # request echoed back as OpenAI does, with its defaults where the client sent nothing.
    tool_choice = request.get("tool_choice")
    reasoning = request.get("reasoning")
    return {
        "id": resp_id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error, "incomplete_details": incomplete_details,
        "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
        "model": model, "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": reasoning if isinstance(reasoning, dict) else None,
        "temperature": request.get("temperature", 1.0), "top_p": request.get("top_p", 1.0),
        "text": _text_echo(request),
        "tool_choice": tool_choice if isinstance(tool_choice, (str, dict)) else "auto",
        "tools": request.get("tools") or [],
        "truncation": "disabled", "usage": usage, "user": request.get("user"),
        "metadata": request.get("metadata") or {},
        "conversation": _conversation(request.get("conversation")),
        # Whether it is kept (GET /v1/responses/{id}): the router sets false where it keeps no state.
        "store": request.get("store") is not False,
    }


def _conversation(conversation: Any) -> dict[str, Any] | None:
    """The conversation the response belongs to, as OpenAI echoes it: {"id"}."""
    if isinstance(conversation, str):
        return {"id": conversation}
    return {"id": conversation.get("id")} if isinstance(conversation, dict) else None


def _text_echo(request: dict[str, Any]) -> dict[str, Any]:
    """The request's text options as OpenAI echoes them (the format asked for, else text)."""
    text = request.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return {"format": fmt if isinstance(fmt, dict) else {"type": "text"}}


@dataclass(slots=True)
class _Item:
    """One output item of a streamed response, from its output_item.added to its output_item.done."""
    kind: str  # reasoning, message or function_call
    id: str
    index: int  # its output_index: items are numbered in the order they are added
    pieces: list[str] = field(default_factory=list)  # reasoning or message text, or call arguments
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # a message's, when the client asked
    call_id: str = ""
    name: str = ""
    done: dict[str, Any] | None = None  # the item as its output_item.done carried it

    def whole(self, status: str) -> dict[str, Any]:
        text = "".join(self.pieces)
        if self.kind == "reasoning":
            return _reasoning_item(self.id, status, text)
        if self.kind == "message":
            return _message_item(self.id, status, text, self.logprobs)
        return _call_item(self.id, status, self.call_id, self.name, text)


class ResponsesStream:
    """One streamed response: chat chunk dicts in, Responses SSE events out (`event:` + `data:` lines).

    Items open when their first delta arrives: reasoning (upstream's reasoning deltas), message (content
    deltas), one function_call per upstream tool call index. A reasoning or message item closes when
    another kind of delta begins; function calls stay open until the end, as upstream may interleave them.
    Call start() once, feed() per upstream chunk, then finish() at upstream's [DONE] or error() on a
    failure; after either end, further calls return b"".
    """

    __slots__ = ("_calls", "_created", "_ended", "_finish", "_id", "_items", "_logprobs", "_open", "_request",
                 "_seq", "_started", "_usage")

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._logprobs = wants_logprobs(request)
        self._id = request.get(CHOSEN_ID) or response_id()
        self._created = int(time.time())
        self._seq = 0
        self._items: list[_Item] = []
        self._open: _Item | None = None  # the reasoning or message item receiving deltas
        self._calls: dict[int, _Item] = {}  # upstream's tool call index -> its open item
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._started = self._ended = False

    def start(self) -> bytes:
        self._started = True
        snapshot = self._snapshot("in_progress", [])
        return self._event("response.created", response=snapshot) + self._event("response.in_progress",
                                                                                 response=snapshot)

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
            delta = choice.get("delta") or {}
            reasoning = reasoning_of(delta)
            if reasoning:
                out += self._text("reasoning", reasoning)
            piece = delta.get("content")
            if piece:
                out += self._text("message", piece, _logprobs(choice.get("logprobs")) if self._logprobs else [])
            for index, call_id, name, fragment in call_deltas(delta):
                out += self._call(index, call_id, name, fragment)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def _text(self, kind: str, piece: str, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != kind:
            out += self._close_open("completed")
            item, added = self._add(kind)
            self._open = item
            out += added + self._event("response.content_part.added", **self._where(item),
                               part=_reasoning_part("") if kind == "reasoning" else _text_part(""))
        item.pieces.append(piece)
        if kind == "reasoning":
            return out + self._event("response.reasoning_text.delta", **self._where(item), delta=piece)
        item.logprobs.extend(logprobs or ())
        return out + self._event("response.output_text.delta", **self._where(item), delta=piece,
                                 logprobs=logprobs or [])

    def _call(self, index: int, call_id: str | None, name: str | None, fragment: str) -> bytes:
        out = b""
        item = self._calls.get(index)
        if item is None:
            out += self._close_open("completed")
            item, added = self._add("function_call", call_id=call_id or f"call_{uuid.uuid4().hex[:24]}",
                                    name=name or "")
            self._calls[index] = item
            out += added
        if fragment:
            item.pieces.append(fragment)
            out += self._event("response.function_call_arguments.delta", item_id=item.id,
                               output_index=item.index, delta=fragment)
        return out

    def _add(self, kind: str, call_id: str = "", name: str = "") -> tuple[_Item, bytes]:
        """A new item, numbered next, and its output_item.added event."""
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = _Item(kind, f"{prefix}_{uuid.uuid4().hex}", len(self._items), call_id=call_id, name=name)
        self._items.append(item)
        added = item.whole("in_progress") if kind == "function_call" else _empty(kind, item.id)
        return item, self._event("response.output_item.added", output_index=item.index, item=added)

    def finish(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        status, details = _status(self._finish)
        out = b""
        if not self._items:  # an empty answer is an empty message, as a non-streamed one is
            item, out = self._add("message")
            self._open = item
            out += self._event("response.content_part.added", **self._where(item), part=_text_part(""))
        out += self._close_open(status)
        for item in self._calls.values():
            out += self._close(item, status)
        final = self._snapshot(status, [item.done or item.whole(status) for item in self._items],
                               usage=_usage(self._usage), incomplete_details=details)
        return out + self._event(f"response.{status}", response=final)

    def _close_open(self, status: str) -> bytes:
        item, self._open = self._open, None
        return b"" if item is None else self._close(item, status)

    def _close(self, item: _Item, status: str) -> bytes:
        done = item.done = item.whole(status)
        text = "".join(item.pieces)
        if item.kind == "function_call":
            out = self._event("response.function_call_arguments.done", item_id=item.id, output_index=item.index,
                              arguments=text)
        elif item.kind == "reasoning":
            out = self._event("response.reasoning_text.done", **self._where(item), text=text)
            out += self._event("response.content_part.done", **self._where(item), part=_reasoning_part(text))
        else:
            out = self._event("response.output_text.done", **self._where(item), text=text, logprobs=item.logprobs)
            out += self._event("response.content_part.done", **self._where(item),
                               part=_text_part(text, item.logprobs))
        return out + self._event("response.output_item.done", output_index=item.index, item=done)

    def error(self, message: str | None) -> bytes:
        """An `error` event, then `response.failed` when the response had started."""
        if self._ended:
            return b""
        self._ended = True
        out = self._event("error", code="server_error", message=message, param=None)
        if self._started:
            output = [item.done or item.whole("incomplete") for item in self._items]
            failed = self._snapshot("failed", output, usage=_usage(self._usage),
                                    error={"code": "server_error", "message": message})
            out += self._event("response.failed", response=failed)
        return out

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def _snapshot(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                  **extra: Any) -> dict[str, Any]:
        return _response(self._id, self._created, self._request, model=self._request.get("model", ""),
                         status=status, output=output, usage=usage, **extra)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = _json.encode({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _empty(kind: str, item_id: str) -> dict[str, Any]:
    """A reasoning or message item as added: in progress, its content part not yet added."""
    return _reasoning_item(item_id, "in_progress", None) if kind == "reasoning" else \
        _message_item(item_id, "in_progress", None)


def refusal_body(status: int, raw: bytes) -> bytes | None:
    """Upstream's 4xx in OpenAI's shape, its chat fields named as the client sent them (max_output_tokens,
    text.format, input); None to pass on one that names none of them as it is."""
    return renamed_refusal(raw, RENAMES)


# Errors in OpenAI's shape; upstream's own 4xx bodies are passed on with the client's field names.
RESPONSES = Codec("responses", "/v1/responses", responses_to_chat, chat_to_response, ResponsesStream, openai_error,
                  refusal_body, bulk=("input",))
