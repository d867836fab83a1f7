"""What an output parser emits: the parsed pieces of one text delta, and the complete calls at the
end. Shared by every reasoning and tool-call parser; runs in each frontend API-server process."""
from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["CallLog", "OutputParser", "ParsedDelta", "TokenOutputParser", "ToolCall", "ToolCallDelta", "make_call_id"]

_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of call `index`: its first delta has id and name, later ones only argument text."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(slots=True)
class ParsedDelta:
    """What one pushed text delta (or the flush) releases: content, reasoning and call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True)
class ToolCall:
    """A complete call; `arguments` is the concatenation of its streamed argument fragments."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    arguments: list[str]  # the streamed fragments, joined once at the end


class CallLog:
    """A tool parser's calls, and the deltas that stream them: `open` sends a call's id and name,
    `add` more of the last call's arguments, joined to this push's delta of that call if it has one
    (one delta per call per push). With `held`, nothing is sent until `release` sends the last call
    whole, in one delta; `drop` forgets a last call that was never released."""

    __slots__ = ("_calls", "_held", "_released")

    def __init__(self, *, held: bool = False) -> None:
        self._calls: list[_Call] = []
        self._held = held
        self._released = 0  # with `held`: how many calls were sent

    def __len__(self) -> int:
        return len(self._calls)

    def open(self, out: ParsedDelta, call_id: str, name: str, arguments: str = "") -> None:
        if not self._held:
            out.tool_calls.append(ToolCallDelta(len(self._calls), call_id, name, arguments))
        self._calls.append(_Call(call_id, name, [arguments] if arguments else []))

    def add(self, out: ParsedDelta, text: str) -> None:
        """Stream more of the last call's arguments."""
        if not text:
            return
        index = len(self._calls) - 1
        self._calls[index].arguments.append(text)
        if self._held:
            return
        last = out.tool_calls[-1] if out.tool_calls else None
        if last is not None and last.index == index:
            last.arguments += text
        else:
            out.tool_calls.append(ToolCallDelta(index, None, None, text))

    @property
    def pending(self) -> bool:
        """With `held`: the last call was opened and not released."""
        return self._held and len(self._calls) > self._released

    def release(self, out: ParsedDelta) -> None:
        """With `held`: send the last call whole."""
        call, index = self._calls[-1], len(self._calls) - 1
        out.tool_calls.append(ToolCallDelta(index, call.id, call.name, "".join(call.arguments)))
        self._released = len(self._calls)

    def drop(self) -> None:
        """With `held`: forget the last call, never released."""
        assert self.pending
        self._calls.pop()

    def complete(self) -> list[ToolCall]:
        calls = self._calls[:self._released] if self._held else self._calls
        return [ToolCall(c.id, c.name, "".join(c.arguments)) for c in calls]


class OutputParser(Protocol):
    """An incremental parser fed each detokenized delta of one request in order."""

    def push(self, text: str) -> ParsedDelta:
        """The parsed pieces that may be emitted now (text that could begin a tag is held)."""

    def flush(self) -> ParsedDelta:
        """At finish, once: whatever is still held."""

    def calls(self) -> list[ToolCall]:
        """The calls seen, in order (complete after flush)."""


@runtime_checkable
class TokenOutputParser(Protocol):
    """A parser of a format whose markers are special tokens (gpt-oss harmony): fed each output's
    token ids in order, instead of detokenized text."""

    def push_tokens(self, ids: Sequence[int]) -> ParsedDelta:
        """The parsed pieces these ids release."""

    def flush(self) -> ParsedDelta:
        """At finish, once: whatever is still held."""

    def calls(self) -> list[ToolCall]:
        """The calls seen, in order (complete after flush)."""


def make_call_id() -> str:
    """An OpenAI-style call id: "call_" and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))
