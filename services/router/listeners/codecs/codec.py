"""What every public API's codec is (router process): the `Codec` record each API's module builds once
(its name, its public path, its pure translations to and from upstream chat/completions), CodecError,
the stream translator's interface, and the helpers the translations share."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

CHAT_PATH = "/v1/chat/completions"  # upstream's chat API, which every adapted API is translated to


class StreamTranslator(Protocol):
    """One streamed answer: upstream chunk dicts in, the API's SSE bytes out. start() once, feed() per
    upstream chunk, then finish() at upstream's [DONE] or error() on a failure; after either end,
    further calls return b""."""

    def start(self) -> bytes: ...

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes: ...

    def error(self, message: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Codec:
    """One public API: what it is called, where it goes upstream, and its pure translations (no I/O:
    the relay feeds and sends). Each API's module builds its one instance; registry.py lists them."""

    name: str  # as listeners' `apis` and the metrics name it: chat, completions, responses, messages
    path: str  # the public path clients POST to
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    """The request as upstream's body (all but the model); CodecError names what cannot be carried."""
    from_chat: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    """(upstream's non-streamed answer, the client's request) -> this API's response body."""
    stream: Callable[[dict[str, Any]], StreamTranslator]
    """A translator for one streamed answer to the request."""
    error_body: Callable[[int, str, str | None], dict[str, Any]]
    """(status, message, param) -> this API's error body."""
    refusal_body: Callable[[int, bytes], bytes | None] = lambda status, raw: None
    """Upstream's 4xx body (OpenAI's error shape) in this API's shape; None to pass it on as it is."""
    upstream_path: str = CHAT_PATH  # the replica's path the translated request goes to
    passthrough: bool = False  # upstream's answer is already this API's: its bytes go to the client as they arrive
    part_of: str = ""  # the listener `apis` name that serves it, when it is another API's route (count_tokens)
    judged: bool = True  # an escalate entry judges its answers; False: the plan's first pool that answers serves it
    bulk: tuple[str, ...] = ()  # request fields the answer's translation never reads (left in a body worker)


class CodecError(ValueError):
    """A request the translation cannot carry faithfully; `param` names the field, as the APIs' 400s do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message


def checked_model(body: Any, refuse: Callable[[dict[str, Any]], None]) -> str:
    """The request's model name, after checking the body is an object and has nothing `refuse` rejects."""
    if not isinstance(body, dict):
        raise CodecError("", "the request body must be a JSON object")
    refuse(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise CodecError("model", "a model name (string) is required")
    return model


def ask_stream(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Carry `stream` over; a streamed answer needs upstream's usage chunk for its final event."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise CodecError("stream", "must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}


def text_parts(content: Any, where: str, kinds: tuple[str, ...], noun: str) -> str | list[dict[str, str]]:
    """A message's content: a string, or a list of text parts (of the given `type`s) kept as chat text
    parts, so that upstream joins them exactly as it does for chat clients."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CodecError(where, f"must be a string or a list of {noun}s")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise CodecError(f"{where}[{j}]", f"must be a {noun} object")
        kind = part.get("type")
        if kind not in kinds:
            raise CodecError(f"{where}[{j}].type", f"{noun} type {kind!r} is not supported; only {list(kinds)}")
        text = part.get("text")
        if not isinstance(text, str):
            raise CodecError(f"{where}[{j}].text", "must be a string")
        parts.append({"type": "text", "text": text})
    return parts


def tool_list(body: dict[str, Any]) -> list[Any]:
    """The request's `tools`: absent or null is none, anything but a list a 400."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise CodecError("tools", "must be a list of tools")
    return tools


def chat_function(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """One function tool in chat's shape; `where` names the tool in the client's request."""
    if not isinstance(name, str) or not name:
        raise CodecError(f"{where}.name", "a function name (non-empty string) is required")
    function: dict[str, Any] = {"name": name}
    if description is not None:
        if not isinstance(description, str):
            raise CodecError(f"{where}.description", "must be a string")
        function["description"] = description
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise CodecError(f"{where}.parameters", "must be a JSON schema object")
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call of an assistant message, in chat's shape."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning text of an answer message or a stream delta ("" if none): vLLM's reasoning
    parsers name it `reasoning_content` (older) or `reasoning` (newer), this fleet's frontend the former."""
    text = message.get("reasoning_content")
    if not text:
        text = message.get("reasoning")
    return text if isinstance(text, str) else ""


def answer_calls(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each tool call in a non-streamed answer's message."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        calls.append((call.get("id") or f"call_{uuid.uuid4().hex[:24]}", function.get("name") or "",
                      function.get("arguments") or ""))
    return calls


def call_deltas(delta: dict[str, Any]) -> list[tuple[int, str | None, str | None, str]]:
    """(index, id, name, arguments fragment) of each tool call piece in a stream delta; the first piece
    of a call carries its id and name, the later ones fragments of its arguments (joined per index)."""
    out = []
    for i, piece in enumerate(delta.get("tool_calls") or ()):
        function = piece.get("function") or {}
        index = piece.get("index", i)
        out.append((index if isinstance(index, int) else i, piece.get("id"), function.get("name"),
                    function.get("arguments") or ""))
    return out
