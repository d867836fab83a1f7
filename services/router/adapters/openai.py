"""The OpenAI chat and completions APIs (router process): upstream speaks them already, so their
adapters pass requests and answers through; the OpenAI error shape, which the Responses API and the
router's own routes share; and the replay of whole chat/completions chunks as a stream."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from services.router.adapters import CHAT_PATH, AdapterError, StreamTranslator

_json = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                502: "upstream_error", 503: "service_unavailable_error", 504: "timeout_error"}


def openai_error(status: int, message: str, param: str | None = None,
                 code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error body; `code` defaults to the status, as the fleet's frontends answer."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"), "param": param,
                      "code": code if code is not None else status}}


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


@dataclass(frozen=True, slots=True)
class PassThrough:
    """An API upstream serves itself: the body goes up as the client sent it (but for the model)."""

    name: str
    path: str
    upstream_path: str
    passthrough: bool = True

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("model"), str):
            raise AdapterError("model", "a model name (string) is required")
        return body

    def from_chat(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        return chat

    def stream(self, request: dict[str, Any]) -> StreamTranslator:
        return ChunkStream()

    def error_body(self, status: int, message: str, param: str | None, code: str | int | None) -> dict[str, Any]:
        return openai_error(status, message, param, code)

    def refusal_body(self, status: int, raw: bytes) -> bytes | None:
        return None


CHAT = PassThrough("chat", "/v1/chat/completions", CHAT_PATH)
COMPLETIONS = PassThrough("completions", "/v1/completions", "/v1/completions")
