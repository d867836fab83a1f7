"""The answer as it passed to the client, assembled whole for the response hooks (router process): a
non-streamed body as it is, a stream's chunks joined into the completion a non-streamed call would have
got. Fed by the relay as the answer goes out; read once it ended."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from services.router.backends.sse import SSEData

_decode = msgspec.json.Decoder()
# A stream longer than this is not assembled (its answer is not kept): bounds what a hook holds per request.
# Passed-through SSE counts its bytes; decoded chunks (adapted streams) count the characters of text they add.
MAX_ANSWER_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    completion: dict[str, Any]  # a chat.completion (or text_completion) object, whole
    streamed: bool  # the client got it as a stream
    complete: bool  # it ended normally ([DONE], or a whole body), not cut off by an error or a break

    def finish_reasons(self) -> tuple[str | None, ...]:
        return tuple(choice.get("finish_reason") for choice in self.completion.get("choices") or ())


class Recorder:
    """One request's answer, recorded as the relay sends it. Feed whole(), body(), raw() or chunk(), then
    end(); answer() is None for anything that was not one complete answer."""

    __slots__ = ("_choices", "_done", "_ended", "_failed", "_head", "_reader", "_size", "_streamed", "_usage",
                 "_whole", "chat")

    def __init__(self, chat: bool) -> None:
        self.chat = chat  # a chat answer (messages), else a completions one (text)
        self._whole: dict[str, Any] | None = None
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._reader: SSEData | None = None
        self._streamed = self._done = self._ended = self._failed = False
        self._size = 0

    def whole(self, completion: dict[str, Any]) -> None:
        """A non-streamed answer (or a whole one replayed as a stream, `streamed` then set by the caller)."""
        self._whole = completion
        self._done = True

    def body(self, raw: bytes) -> None:
        """A passed-through JSON body."""
        try:
            value = _decode.decode(raw)
        except msgspec.DecodeError:
            self._failed = True
            return
        if isinstance(value, dict):
            self.whole(value)
        else:
            self._failed = True

    def raw(self, data: bytes) -> None:
        """Passed-through SSE bytes, as they arrive."""
        if self._failed:
            return
        self._size += len(data)
        if self._size > MAX_ANSWER_BYTES:
            self._failed = True
            return
        if self._reader is None:
            self._reader = SSEData()
        self._events(self._reader.feed(data))

    def chunk(self, chunk: dict[str, Any]) -> None:
        """One decoded upstream chunk of a stream."""
        self._streamed = True
        if self._failed:
            return
        if "error" in chunk:
            self._failed = True
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk and key not in self._head:
                self._head[key] = chunk[key]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for i, piece in enumerate(chunk.get("choices") or ()):
            if not isinstance(piece, dict):
                self._failed = True
                return
            if self._reader is None:  # decoded by the relay: raw() did not count it
                self._size += _text_size(piece)
                if self._size > MAX_ANSWER_BYTES:
                    self._failed = True
                    return
            index = piece.get("index", i)
            choice = self._choices.setdefault(index if isinstance(index, int) else i, {"index": index})
            if self.chat:
                _add_delta(choice, piece.get("delta") or {})
            else:
                choice.setdefault("_text", []).append(piece.get("text") or "")
            if piece.get("finish_reason") is not None:
                choice["finish_reason"] = piece["finish_reason"]

    def end(self, done: bool = True) -> None:
        """The answer's end: `done` false when upstream broke off (nothing is kept of it)."""
        if self._reader is not None:
            self._events(self._reader.finish())
        elif done and self._streamed:
            self._done = True  # fed decoded chunks: the relay read the [DONE] that `done` reports
        self._ended = True
        if not done:
            self._failed = True

    def answer(self) -> Answer | None:
        if self._failed or not self._done:
            return None
        if self._whole is not None:
            return Answer(self._whole, self._streamed, True)
        choices = [self._finished(self._choices[i]) for i in sorted(self._choices)]
        completion = {"id": self._head.get("id", ""), "object": "chat.completion" if self.chat else "text_completion",
                      "created": self._head.get("created", 0), "model": self._head.get("model", ""),
                      "choices": choices}
        if "system_fingerprint" in self._head:
            completion["system_fingerprint"] = self._head["system_fingerprint"]
        if self._usage is not None:
            completion["usage"] = self._usage
        return Answer(completion, True, True)

    def _events(self, events: list[bytes]) -> None:
        for data in events:
            data = data.strip()
            if data == b"[DONE]":
                self._done = True
            elif data:
                try:
                    value = _decode.decode(data)
                except msgspec.DecodeError:
                    self._failed = True
                    return
                if not isinstance(value, dict):
                    self._failed = True
                    return
                self.chunk(value)

    def _finished(self, choice: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice["index"]}
        if self.chat:
            message: dict[str, Any] = {"role": choice.get("role", "assistant"),
                                       "content": "".join(choice.get("_content", ())) or None}
            if choice.get("_reasoning"):
                message["reasoning_content"] = "".join(choice["_reasoning"])
            calls = choice.get("_calls")
            if calls:
                message["tool_calls"] = [{"id": c["id"], "type": "function",
                                          "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                                         for _, c in sorted(calls.items())]
            out["message"] = message
        else:
            out["text"] = "".join(choice.get("_text", ()))
        out["finish_reason"] = choice.get("finish_reason")
        return out


def _add_delta(choice: dict[str, Any], delta: dict[str, Any]) -> None:
    if isinstance(delta.get("role"), str):
        choice["role"] = delta["role"]
    if isinstance(delta.get("content"), str):
        choice.setdefault("_content", []).append(delta["content"])
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        choice.setdefault("_reasoning", []).append(reasoning)
    for j, piece in enumerate(delta.get("tool_calls") or ()):
        if not isinstance(piece, dict):
            continue
        index = piece.get("index", j)
        calls = choice.setdefault("_calls", {})
        call = calls.setdefault(index if isinstance(index, int) else j, {"id": "", "name": "", "arguments": []})
        function = piece.get("function") or {}
        if piece.get("id"):
            call["id"] = piece["id"]
        if function.get("name"):
            call["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            call["arguments"].append(function["arguments"])


def _text_size(piece: dict[str, Any]) -> int:
    """The characters of text one choice's chunk adds: what the recorder will hold of it."""
    raw = piece.get("delta")
    delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    size = 0
    for value in (piece.get("text"), delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning")):
        if isinstance(value, str):
            size += len(value)
    for call in delta.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            size += len(function["arguments"])
    return size
