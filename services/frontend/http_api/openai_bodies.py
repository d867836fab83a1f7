"""OpenAI response bodies and SSE chunks. A stream's chunk is a precomputed prefix and suffix around
the one JSON-escaped piece that changes per token, so the per-token cost is one string encode."""
from __future__ import annotations

import time
from typing import Any

import msgspec

from services.frontend.parsers import ParsedDelta, ToolCall, ToolCallDelta

_json = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """SSE events of one streamed response (chat or text completion)."""

    __slots__ = ("_chat", "_created", "_delta_prefix", "_head", "_id", "_index", "_lp_head", "_lp_tail", "_model",
                 "_text_prefix", "_text_suffix")

    def __init__(self, request_id: str, model: str, *, chat: bool, index: int = 0, created: int | None = None) -> None:
        """`index`: the choice it writes (one writer per choice); `created`: its response's time, which
        every choice's chunks carry."""
        self._id, self._model, self._chat, self._index = request_id, model, chat, index
        self._created = int(time.time()) if created is None else created
        head = _json.encode({"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                             "created": self._created, "model": model})[:-1]
        self._head = b"data: " + head + b',"choices":[{"index":' + str(index).encode() + b","
        self._delta_prefix = self._head + b'"delta":{'
        if chat:
            self._text_prefix = self._head + b'"delta":{"content":'
            self._lp_head = b'},"logprobs":'
        else:
            self._text_prefix = self._head + b'"text":'
            self._lp_head = b',"logprobs":'
        # A chunk's end; with logprobs, their JSON goes between _lp_head and _lp_tail instead of null.
        self._lp_tail = b',"finish_reason":null}]}\n\n'
        self._text_suffix = self._lp_head + b"null" + self._lp_tail

    def _suffix(self, logprobs: bytes | None, use: dict[str, Any] | None) -> bytes:
        suffix = self._text_suffix if logprobs is None else self._lp_head + logprobs + self._lp_tail
        return suffix if use is None else suffix[:-3] + b',"usage":' + _json.encode(use) + b"}\n\n"

    def role(self, use: dict[str, Any] | None = None) -> bytes:
        chunk = self._head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
        return chunk + (b',"usage":' + _json.encode(use) if use is not None else b"") + b"}\n\n"

    def text_frame(self) -> tuple[bytes, bytes]:
        """What text(piece) puts before and after the piece's JSON string."""
        return self._text_prefix, self._text_suffix

    def logprobs_frame(self, head: bytes, tail: bytes) -> tuple[bytes, bytes, bytes]:
        """What text(piece, logprobs=...) puts before the piece's JSON string, between it and the entries,
        and after them, where the logprobs' JSON is `head` + the entries, commas between + `tail`."""
        return self._text_prefix, self._lp_head + head, tail + self._lp_tail

    def text(self, piece: str, use: dict[str, Any] | None = None, logprobs: bytes | None = None) -> bytes:
        """`use`: the usage so far, for stream_options.continuous_usage_stats; `logprobs`: the JSON of
        the piece's tokens' logprobs (LogprobsFormatter.render)."""
        if use is None:
            if logprobs is None:
                return self._text_prefix + _json.encode(piece) + self._text_suffix
            # One copy of the logprobs (a streamed token's are most of its chunk), not one per +.
            return b"".join((self._text_prefix, _json.encode(piece), self._lp_head, logprobs, self._lp_tail))
        return self._text_prefix + _json.encode(piece) + self._suffix(logprobs, use)

    def delta(self, parsed: ParsedDelta, use: dict[str, Any] | None = None, logprobs: bytes | None = None) -> bytes:
        """A chunk of a parser's delta: content, reasoning (vLLM's two names for it) and tool-call deltas.
        A call's first delta carries its index, id, type and name; later ones argument fragments only."""
        if use is None and not parsed.content:
            fast = self._fast_delta(parsed, self._text_suffix if logprobs is None else self._suffix(logprobs, None))
            if fast is not None:
                return fast
        delta: dict[str, Any] = {}
        if parsed.reasoning:
            delta["reasoning_content"] = delta["reasoning"] = parsed.reasoning
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.tool_calls:
            delta["tool_calls"] = [_call_delta(call) for call in parsed.tool_calls]
        fields: dict[str, Any] = {"choices": [{"index": self._index, "delta": delta, "logprobs": _raw(logprobs),
                                               "finish_reason": None}]}
        if use is not None:
            fields["usage"] = use
        return self._event(fields)

    def _fast_delta(self, parsed: ParsedDelta, suffix: bytes) -> bytes | None:
        """The two deltas of nearly every parsed token, reasoning text or one call's argument fragment,
        built around their one encoded string as text() does; None for any other shape."""
        if parsed.reasoning and not parsed.tool_calls:
            piece = _json.encode(parsed.reasoning)
            return self._delta_prefix + b'"reasoning_content":' + piece + b',"reasoning":' + piece + suffix
        calls = parsed.tool_calls
        if not parsed.reasoning and len(calls) == 1 and calls[0].id is None and calls[0].name is None:
            return (self._delta_prefix + b'"tool_calls":[{"index":' + str(calls[0].index).encode()
                    + b',"function":{"arguments":' + _json.encode(calls[0].arguments) + b"}}]" + suffix)
        return None

    def finish(self, reason: str, stop_reason: int | str | None = None, use: dict[str, Any] | None = None,
               logprobs: bytes | None = None) -> bytes:
        """`logprobs`: those of tokens no earlier chunk carried (the EOS, text a stop string cut)."""
        choice: dict[str, Any] = {"index": self._index, "logprobs": _raw(logprobs), "finish_reason": reason}
        if self._chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        return self._event({"choices": [choice], "usage": use} if use is not None else {"choices": [choice]})

    def usage(self, body: dict[str, Any]) -> bytes:
        return self._event({"choices": [], "usage": body})

    def error(self, status: int, message: str) -> bytes:
        return b"data: " + _json.encode({"error": {"message": message, "type": "engine_error",
                                                   "param": None, "code": status}}) + b"\n\n"

    def _event(self, fields: dict[str, Any]) -> bytes:
        obj = {"id": self._id, "object": "chat.completion.chunk" if self._chat else "text_completion",
               "created": self._created, "model": self._model, **fields}
        return b"data: " + _json.encode(obj) + b"\n\n"


def _raw(json_text: bytes | str | None) -> msgspec.Raw | None:
    """Pre-rendered JSON (logprobs, as UTF-8; prompt_logprobs, as text) placed in a body as it is."""
    return None if json_text is None else msgspec.Raw(json_text)


def chat_completion(request_id: str, model: str, text: str, finish: str, stop_reason: int | str | None,
                    use: dict[str, Any], *, reasoning: str | None = None,
                    tool_calls: list[ToolCall] | None = None, logprobs: bytes | None = None,
                    prompt_logprobs: str | None = None) -> bytes:
    """A one-choice chat completion (chat_choice's fields)."""
    choice = chat_choice(0, text, finish, stop_reason, reasoning=reasoning, tool_calls=tool_calls, logprobs=logprobs)
    return completion_body(request_id, model, [choice], use, chat=True, prompt_logprobs=prompt_logprobs)


def chat_choice(index: int, text: str, finish: str, stop_reason: int | str | None, *, reasoning: str | None = None,
                tool_calls: list[ToolCall] | None = None, logprobs: bytes | None = None) -> dict[str, Any]:
    """`reasoning` and `tool_calls` are None when no parser ran: the message then has neither field.
    `logprobs` is JSON (LogprobsFormatter's)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        # vLLM's field, under its older name and its newer one; null when the model did not reason.
        message["reasoning_content"] = message["reasoning"] = reasoning or None
    if tool_calls is not None:
        message["tool_calls"] = [_tool_call(call) for call in tool_calls]
        if tool_calls and not text:
            message["content"] = None  # as OpenAI: a message of tool calls alone has no content
    return {"index": index, "message": message, "logprobs": _raw(logprobs), "finish_reason": finish,
            "stop_reason": stop_reason}


def text_choice(index: int, text: str, finish: str, stop_reason: int | str | None, *, logprobs: bytes | None = None,
                prompt_logprobs: str | None = None) -> dict[str, Any]:
    """`logprobs`, `prompt_logprobs`: JSON, as for chat_choice; the latter in the choice (vLLM's place)."""
    choice: dict[str, Any] = {"index": index, "text": text, "logprobs": _raw(logprobs), "finish_reason": finish,
                              "stop_reason": stop_reason}
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = _raw(prompt_logprobs)
    return choice


def completion_body(request_id: str, model: str, choices: list[dict[str, Any]], use: dict[str, Any], *,
                    chat: bool, prompt_logprobs: str | None = None) -> bytes:
    """A chat completion or a text completion of these choices; a chat's `prompt_logprobs` (JSON) are
    the response's, there only when asked for (vLLM's)."""
    body: dict[str, Any] = {"id": request_id, "object": "chat.completion" if chat else "text_completion",
                            "created": int(time.time()), "model": model, "choices": choices, "usage": use}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = _raw(prompt_logprobs)
    return _json.encode(body)


def _call_delta(call: ToolCallDelta) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": call.arguments}
    out: dict[str, Any] = {"index": call.index, "function": function}
    if call.id is not None:
        out["id"], out["type"] = call.id, "function"
    if call.name is not None:
        function["name"] = call.name
    return out


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def text_completion(request_id: str, model: str, text: str, finish: str, stop_reason: int | str | None,
                    use: dict[str, Any], *, logprobs: bytes | None = None, prompt_logprobs: str | None = None) -> bytes:
    """A one-choice text completion (text_choice's fields)."""
    choice = text_choice(0, text, finish, stop_reason, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    return completion_body(request_id, model, [choice], use, chat=False)


def models(name: str, max_model_len: int, created: int, adapters: dict[str, str] | None = None,
           tasks: list[str] | None = None) -> bytes:
    """/v1/models: the base model, then each LoRA adapter (name: root) on it, as vLLM lists them, each with
    this server's extra key `tasks`: what the engines serve, as vLLM names the tasks ("generate", "embed",
    "classify", ...; [] before any engine has handshaken). Clients that do not know the key ignore it."""
    served = tasks or []
    data = [{"id": name, "object": "model", "created": created, "owned_by": "fleet", "root": name,
             "parent": None, "max_model_len": max_model_len, "tasks": served}]
    data += [{"id": lora, "object": "model", "created": created, "owned_by": "fleet", "root": root,
              "parent": name, "max_model_len": max_model_len, "tasks": served}
             for lora, root in (adapters or {}).items()]
    return _json.encode({"object": "list", "data": data})


def generate_response(request_id: str, model: str, token_ids: list[int], finish: str, use: dict[str, Any],
                      text: str | None = None, logprobs: bytes | None = None,
                      prompt_logprobs: str | None = None) -> bytes:
    """/inference/v1/generate's answer (vLLM's GenerateResponse); `text` only when the request asked;
    `logprobs` and `prompt_logprobs`: JSON (LogprobsFormatter's token-out entries, vLLM's prompt rows)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": _raw(logprobs), "finish_reason": finish, "token_ids": token_ids,
                              "routed_experts": None}
    if text is not None:
        choice["text"] = text
    return _json.encode({"request_id": request_id, "model": model, "created": int(time.time()),
                         "choices": [choice], "usage": use, "prompt_logprobs": _raw(prompt_logprobs),
                         "kv_transfer_params": None, "ec_transfer_params": None})


class TokenChunkWriter:
    """SSE events of one streamed /inference/v1/generate answer (vLLM's GenerateStreamResponse)."""

    __slots__ = ("_head",)

    def __init__(self, request_id: str) -> None:
        self._head = b'data: {"request_id":' + _json.encode(request_id) + b',"choices":'

    def chunk(self, token_ids: list[int], finish: str | None, use: dict[str, Any] | None = None,
              text: str | None = None, logprobs: bytes | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": _raw(logprobs), "finish_reason": finish,
                                  "token_ids": token_ids, "routed_experts": None}
        if text is not None:
            choice["text"] = text
        return self._head + _json.encode([choice]) + b',"usage":' + _json.encode(use) + b"}\n\n"

    def usage(self, body: dict[str, Any]) -> bytes:
        return self._head + b'[],"usage":' + _json.encode(body) + b"}\n\n"
