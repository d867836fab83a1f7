"""The tokens an answer's `usage` reports, read as the relay passes the answer on (router process), so that
a request's token charge (listeners/limits.py) is corrected when it ends: a whole body's, or a stream's
chunk that carries it (OpenAI sends one before [DONE] where `stream_options.include_usage` asked for it)."""
from __future__ import annotations

from typing import Any, TypeGuard

import msgspec

from services.router.backends.sse import SSEData


class _WithUsage(msgspec.Struct):
    usage: Any = None  # msgspec skips every other field without building it


_decode = msgspec.json.Decoder(_WithUsage)


def usage_tokens(usage: Any) -> int | None:
    """total_tokens, else prompt + completion (chat), else input + output (Responses, images); None if none."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if _count(total):
        return total
    for a, b in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        x, y = usage.get(a), usage.get(b)
        if _count(x) and _count(y):
            return x + y
    return None


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Usage:
    """One answer's token count, None until a usage is seen. `streamed_usage`: a passed-through stream may
    carry one (the client asked include_usage); when not, its bytes are not even parsed."""

    __slots__ = ("_reader", "streamed_usage", "tokens")

    def __init__(self, streamed_usage: bool = False) -> None:
        self.tokens: int | None = None
        self.streamed_usage = streamed_usage
        self._reader: SSEData | None = None

    def whole(self, completion: dict[str, Any]) -> None:
        """A whole answer (decoded)."""
        self._take(completion.get("usage"))

    def chunk(self, chunk: dict[str, Any]) -> None:
        """One decoded chunk of a stream."""
        if chunk.get("usage"):
            self._take(chunk["usage"])

    def body(self, raw: bytes) -> None:
        """A passed-through JSON body."""
        try:
            self._take(_decode.decode(raw).usage)
        except msgspec.DecodeError:  # not an object: nothing to read
            pass

    def raw(self, data: bytes) -> None:
        """Passed-through SSE bytes, as they arrive: only the events that name a usage are decoded."""
        if not self.streamed_usage:
            return
        if self._reader is None:
            self._reader = SSEData()
        for event in self._reader.feed(data):
            if b'"usage"' in event:
                self.body(event)

    def _take(self, usage: Any) -> None:
        tokens = usage_tokens(usage)
        if tokens is not None:
            self.tokens = tokens
