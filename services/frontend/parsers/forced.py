"""Output of a forced tool_choice (frontend API-server processes): the engine's structured output
guarantees its shape, so these parsers only read it. Chosen by tool_choice, not by a flag.

- A named function: the whole output is that function's arguments object. Its first delta carries
  the call's id and name with the first text; every later delta is an argument fragment.
- "required": the output is a JSON array of {"name", "parameters"} objects (the schema
  tools.forced_schema builds). It is read whole at the end and each call sent in one delta, ids in
  array order; output cut short by max_tokens (no complete array) comes back as content, as it was
  written, with finish_reason "length" saying why.
"""
from __future__ import annotations

import json

from services.frontend.parsers.delta import ParsedDelta, ToolCall, ToolCallDelta, make_call_id

__all__ = ["NamedToolParser", "RequiredToolParser"]


class NamedToolParser:
    __slots__ = ("_id", "_name", "_parts")

    def __init__(self, name: str) -> None:
        self._name = name
        self._id = make_call_id()
        self._parts: list[str] = []

    def push(self, text: str) -> ParsedDelta:
        first = not self._parts
        self._parts.append(text)
        if first:
            return ParsedDelta(tool_calls=[ToolCallDelta(0, self._id, self._name, text)])
        return ParsedDelta(tool_calls=[ToolCallDelta(0, None, None, text)])

    def flush(self) -> ParsedDelta:
        return ParsedDelta()

    def calls(self) -> list[ToolCall]:
        return [ToolCall(self._id, self._name, "".join(self._parts))] if self._parts else []


class RequiredToolParser:
    __slots__ = ("_calls", "_parts")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._calls: list[ToolCall] = []

    def push(self, text: str) -> ParsedDelta:
        self._parts.append(text)
        return ParsedDelta()

    def flush(self) -> ParsedDelta:
        text = "".join(self._parts)
        try:
            items = json.loads(text)
            calls = [ToolCall(make_call_id(), item["name"], json.dumps(item["parameters"], ensure_ascii=False))
                     for item in items]
        except (ValueError, TypeError, KeyError):
            return ParsedDelta(content=text)
        self._calls = calls
        return ParsedDelta(tool_calls=[ToolCallDelta(i, call.id, call.name, call.arguments)
                                       for i, call in enumerate(calls)])

    def calls(self) -> list[ToolCall]:
        return self._calls
