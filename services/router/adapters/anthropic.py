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
    answer_calls,
    ask_stream,
    call_deltas,
    chat_call,
    chat_function,
    checked_model,
    reasoning_of,
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
    _ask_tools(body, chat)
    _ask_thinking(body, chat, max_tokens)
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
    for name in ("mcp_servers", "container", "output_format"):
        if body.get(name):
            raise AdapterError(name, "is not supported by this server")
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format"):
        raise AdapterError("output_config.format", "structured outputs are not supported by this server")


def _ask_tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Client tools, tool_choice and disable_parallel_tool_use in chat's shape; server tools are refused."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise AdapterError("tools", "must be a list of tools")
    names = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise AdapterError(f"tools[{i}]", "must be a tool object")
        kind = tool.get("type")
        if kind not in (None, "custom"):  # Anthropic's server tools (web_search_..., bash_..., ...)
            raise AdapterError(f"tools[{i}].type", f"tool type {kind!r} is not supported; only client tools")
        if not isinstance(tool.get("input_schema"), dict):
            raise AdapterError(f"tools[{i}].input_schema", "is required: a JSON schema object")
        function = chat_function(tool.get("name"), tool.get("description"), tool["input_schema"], f"tools[{i}]")
        names.add(function["function"]["name"])
        chat.setdefault("tools", []).append(function)
    choice = body.get("tool_choice")
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise AdapterError("tool_choice", "must be {'type': 'auto' | 'any' | 'tool' | 'none'}")
    if kind in ("any", "tool") and not names:
        raise AdapterError("tool_choice", f"{{'type': {kind!r}}} needs at least one tool")
    if kind == "tool":
        name = choice.get("name")
        if name not in names:
            raise AdapterError("tool_choice.name", f"must name a tool in tools, got {name!r}")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif names:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    single = choice.get("disable_parallel_tool_use")
    if single is not None:
        if not isinstance(single, bool):
            raise AdapterError("tool_choice.disable_parallel_tool_use", "must be a boolean")
        if single and names:
            chat["parallel_tool_calls"] = False


def _ask_thinking(body: dict[str, Any], chat: dict[str, Any], max_tokens: int) -> None:
    """Extended thinking on or off through the chat template (Qwen3's and others' `enable_thinking`);
    the budget is checked as Anthropic checks it but cannot be enforced upstream: max_tokens bounds it."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        chat["chat_template_kwargs"] = {"enable_thinking": False}
        return
    if kind != "enabled":
        raise AdapterError("thinking.type", "only 'enabled' and 'disabled' are supported")
    budget = thinking.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1024 <= budget < max_tokens:
        raise AdapterError("thinking.budget_tokens", f"must be an integer >= 1024 and < max_tokens ({max_tokens})")
    chat["chat_template_kwargs"] = {"enable_thinking": True}


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise AdapterError("messages", "is required: a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise AdapterError(where, "must be a message object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise AdapterError(f"{where}.role", "must be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, list) and role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        elif isinstance(content, list):
            out.extend(_user(content, f"{where}.content"))
        else:
            out.append({"role": role, "content": _content(content, f"{where}.content")})
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    """An assistant turn's blocks as one chat message: text, tool_use as tool_calls, thinking as its
    reasoning_content (the signature, which only Anthropic can check, and redacted thinking are dropped)."""
    texts: list[dict[str, str]] = []
    calls, thoughts = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise AdapterError(f"{where}[{j}].id", "is required: a non-empty string")
            if not isinstance(name, str) or not name:
                raise AdapterError(f"{where}[{j}].name", "is required: a non-empty string")
            if not isinstance(arguments, dict):
                raise AdapterError(f"{where}[{j}].input", "is required: an object")
            calls.append(chat_call(call_id, name, _json.encode(arguments).decode()))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise AdapterError(f"{where}[{j}].thinking", "must be a string")
            thoughts.append(block["thinking"])
        elif kind != "redacted_thinking":
            texts.append(_text_block(block, f"{where}[{j}]", "tool_use, thinking, redacted_thinking"))
    message: dict[str, Any] = {"role": "assistant", "content": texts if texts or not calls else None}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks in order: each tool_result a tool message, each run of text blocks a user message."""
    out: list[dict[str, Any]] = []
    texts: list[dict[str, str]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append(_tool_result(block, f"{where}[{j}]"))
        else:
            texts.append(_text_block(block, f"{where}[{j}]", "tool_result"))
    if texts or not out:
        out.append({"role": "user", "content": texts})
    return out


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A tool_result as a tool message. Chat has no error flag: an error result's text is led by "Error: "
    so that the model still reads that the call failed."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise AdapterError(f"{where}.tool_use_id", "is required: a non-empty string")
    content = block.get("content", "")
    content = _content(content, f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise AdapterError(f"{where}.is_error", "must be a boolean")
    if is_error:
        content = "Error: " + content if isinstance(content, str) else [{"type": "text", "text": "Error: "}, *content]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    # cache_control and citations are dropped: prefix caching upstream is automatic.
    return text_parts(content, where, ("text",), "content block")


def _text_block(block: Any, where: str, others: str) -> dict[str, str]:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind != "text":
        raise AdapterError(where, f"content block type {kind!r} is not supported here; only text, {others}")
    if not isinstance(block.get("text"), str):
        raise AdapterError(f"{where}.text", "must be a string")
    return {"type": "text", "text": block["text"]}


def chat_to_message(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion as an Anthropic `message` object: blocks in the order thinking,
    text, tool_use."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reasoning = reasoning_of(message)
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
    Anthropic sends them: thinking (upstream's reasoning deltas), text (content deltas), one tool_use per
    upstream tool call, whose argument fragments go out as they are as input_json_delta. The ping follows
    the first block's start, as Anthropic's does.
    Call start() once, feed() per upstream chunk, then finish() at upstream's [DONE] or error() on a
    failure; after either end, further calls return b"".
    """

    __slots__ = ("_blocks", "_calls", "_ended", "_finish", "_id", "_kind", "_matched", "_request", "_usage")

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
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
            reasoning = reasoning_of(delta)
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


def _refusal_body(status: int, raw: bytes) -> bytes:
    """Every error in Anthropic's shape, upstream's 4xx (OpenAI's shape) too."""
    try:
        message = _decode.decode(raw)["error"]["message"]
    except (msgspec.DecodeError, KeyError, TypeError):
        message = raw[:500].decode(errors="replace")
    return _json.encode(anthropic_error(status, message))


MESSAGES = Adapter("messages", "/v1/messages", messages_to_chat, chat_to_message, MessagesStream,
                   lambda status, message, param, code: anthropic_error(status, message), _refusal_body)
