"""A reasoning parser and a tool parser run as one: the reasoning parser sees the text first and
its content goes on through the tool parser. Runs in frontend API-server processes."""
from __future__ import annotations

from services.frontend.parsers.delta import OutputParser, ParsedDelta, ToolCall

__all__ = ["Chain"]


class Chain:
    """Reasoning first, then tool calls in what the reasoning parser calls content."""

    __slots__ = ("_reasoning", "_tools")

    def __init__(self, reasoning: OutputParser, tools: OutputParser) -> None:
        self._reasoning, self._tools = reasoning, tools

    def push(self, text: str) -> ParsedDelta:
        first = self._reasoning.push(text)
        if not first.content:
            return first
        second = self._tools.push(first.content)
        second.reasoning = first.reasoning
        return second

    def flush(self) -> ParsedDelta:
        first = self._reasoning.flush()
        out = self._tools.push(first.content) if first.content else ParsedDelta()
        last = self._tools.flush()
        out.content += last.content
        out.tool_calls.extend(last.tool_calls)
        out.reasoning = first.reasoning
        return out

    def calls(self) -> list[ToolCall]:
        return self._tools.calls()
