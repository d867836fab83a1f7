"""Incremental reasoning and tool-call parsers (frontend API server process): the deltas they emit and
the one interface output processing drives. Placeholder for the parser package's own module."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ParsedDelta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


class OutputParser(Protocol):
    def push(self, text: str) -> ParsedDelta: ...

    def flush(self) -> ParsedDelta: ...

    def calls(self) -> list[ToolCall]: ...
