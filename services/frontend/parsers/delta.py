"""What an output parser emits: the parsed pieces of one text delta, and the complete calls at the
end. Shared by every reasoning and tool-call parser; runs in each frontend API-server process."""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["OutputParser", "ParsedDelta", "ToolCall", "ToolCallDelta", "make_call_id"]

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


class OutputParser(Protocol):
    """An incremental parser fed each detokenized delta of one request in order."""

    def push(self, text: str) -> ParsedDelta:
        """The parsed pieces that may be emitted now (text that could begin a tag is held)."""

    def flush(self) -> ParsedDelta:
        """At finish, once: whatever is still held."""

    def calls(self) -> list[ToolCall]:
        """The calls seen, in order (complete after flush)."""


def make_call_id() -> str:
    """An OpenAI-style call id: "call_" and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))
