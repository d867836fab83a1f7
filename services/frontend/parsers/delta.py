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
    (one delta per call per push)."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: list[_Call] = []

    def __len__(self) -> int:
        return len(self._calls)

    def open(self, out: ParsedDelta, call_id: str, name: str, arguments: str = "") -> None:
        out.tool_calls.append(ToolCallDelta(len(self._calls), call_id, name, arguments))
        self._calls.append(_Call(call_id, name, [arguments] if arguments else []))

    def add(self, out: ParsedDelta, text: str) -> None:
        """Stream more of the last call's arguments."""
        if not text:
            return
        index = len(self._calls) - 1
        self._calls[index].arguments.append(text)
        last = out.tool_calls[-1] if out.tool_calls else None
        if last is not None and last.index == index:
            last.arguments += text
        else:
            out.tool_calls.append(ToolCallDelta(index, None, None, text))

    def complete(self) -> list[ToolCall]:
        return [ToolCall(c.id, c.name, "".join(c.arguments)) for c in self._calls]


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
