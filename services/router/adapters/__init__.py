"""The router's public APIs as adapters to upstream chat/completions (router process): the `Adapter`
record each API builds once, one module per API (openai: chat and completions as they are;
responses; anthropic), found by name in registry.py, and the helpers the request translations share."""
from __future__ import annotations

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
class Adapter:
    """One public API: what it is called, where it goes upstream, and its pure translations (no I/O:
    the dispatcher feeds and sends). Each API's module builds its one instance; registry.py lists them."""

    name: str  # as listeners' `apis` and the metrics name it: chat, completions, responses, messages
    path: str  # the public path clients POST to
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    """The request as upstream's body (all but the model); AdapterError names what cannot be carried."""
    from_chat: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    """(upstream's non-streamed answer, the client's request) -> this API's response body."""
    stream: Callable[[dict[str, Any]], StreamTranslator]
    """A translator for one streamed answer to the request."""
    error_body: Callable[[int, str, str | None, str | int | None], dict[str, Any]]
    """(status, message, param, code) -> this API's error body."""
    refusal_body: Callable[[int, bytes], bytes | None] = lambda status, raw: None
    """Upstream's 4xx body (OpenAI's error shape) in this API's shape; None to pass it on as it is."""
    upstream_path: str = CHAT_PATH  # the replica's path the translated request goes to
    passthrough: bool = False  # upstream's answer is already this API's: its bytes go to the client as they arrive


class AdapterError(ValueError):
    """A request the translation cannot carry faithfully; `param` names the field, as the APIs' 400s do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message


def checked_model(body: Any, refuse: Callable[[dict[str, Any]], None]) -> str:
    """The request's model name, after checking the body is an object and has nothing `refuse` rejects."""
    if not isinstance(body, dict):
        raise AdapterError("", "the request body must be a JSON object")
    refuse(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise AdapterError("model", "a model name (string) is required")
    return model


def ask_stream(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Carry `stream` over; a streamed answer needs upstream's usage chunk for its final event."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise AdapterError("stream", "must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}


def text_parts(content: Any, where: str, kinds: tuple[str, ...], noun: str) -> str | list[dict[str, str]]:
    """A message's content: a string, or a list of text parts (of the given `type`s) kept as chat text
    parts, so that upstream joins them exactly as it does for chat clients."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise AdapterError(where, f"must be a string or a list of {noun}s")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise AdapterError(f"{where}[{j}]", f"{noun} type {kind!r} is not supported; only {list(kinds)}")
        text = part.get("text")
        if not isinstance(text, str):
            raise AdapterError(f"{where}[{j}].text", "must be a string")
        parts.append({"type": "text", "text": text})
    return parts
