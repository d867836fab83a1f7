"""Router-side translations of the OpenAI Responses and Anthropic Messages APIs to upstream chat."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
