"""The `minimax_m2` tool-call parser (MiniMax-M2, M2.1): calls in a `<minimax:tool_call>` block, one
`<invoke name="NAME">` per call, its arguments `<parameter name="P">VALUE</parameter>` pairs; and
its reasoning parser, `<think>` reasoning as glm45's (the output starts in reasoning unless the prompt
closed the think block; a `<minimax:tool_call>` ends the reasoning), as vLLM reads them. Runs in
frontend API-server processes.

The block is held until its `</minimax:tool_call>` (or the end of output) and then read whole: each
complete `<invoke>...</invoke>` is a call, sent in one delta, its arguments the JSON object of its
parameters. A value is typed by its parameter's schema in the request's tools as in qwen3_coder (a
parameter the tools do not describe takes the text as JSON when it parses, else the text); a string
keeps its text verbatim, whitespace included, and a value without its `</parameter>` ends at the
next `<parameter`, as vLLM reads them. Where the model strays: a block with no complete invoke is
content, as the model wrote it, tags included; in a block the output ends inside of (cut by
max_tokens, or a stop string), the invokes before the cut are calls and the unfinished one is
content; other text in a block around its invokes is framing and is dropped.
"""
from __future__ import annotations

import json
import re
from typing import Any

from services.frontend.parsers.call_blocks import CallBlockParser
from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.schema_types import (
    STRING_TYPES,
    json_or_text,
    parameter_schemas,
    schema_type,
    typed_value,
)
from services.frontend.parsers.think import ThinkParser, prompt_closes_think

__all__ = ["MinimaxM2ToolParser", "minimax_m2"]

_INVOKE = re.compile(r"<invoke\s+name\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^>\s]+))\s*>(.*?)</invoke>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter\s+name\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^>\s]+))\s*>(.*?)"
                        r"(?:</parameter>|(?=<parameter\s+name\s*=)|\Z)", re.DOTALL)


class MinimaxM2ToolParser(CallBlockParser):
    """`<minimax:tool_call>` blocks of `<invoke>`s to tool calls, each sent once its block has ended."""

    START = "<minimax:tool_call>"
    END = "</minimax:tool_call>"

    __slots__ = ("_schemas",)

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self._schemas = parameter_schemas(tools or [])

    def _begin(self) -> None:
        pass

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        buf = self._buf
        end = buf.find(self.END)
        if end < 0 and not final:
            return False
        body = buf if end < 0 else buf[:end]
        self._buf = "" if end < 0 else buf[end + len(self.END):]
        invokes = list(_INVOKE.finditer(body))
        if not invokes or any(not _name(m) for m in invokes):
            out.content += self.START + body + ("" if end < 0 else self.END)
            return True
        for invoke in invokes:
            name = _name(invoke)
            self._open_call(out, name, json.dumps(self._arguments(name, invoke.group(4)), ensure_ascii=False))
        if end < 0:  # the output ended inside the block: what follows the last complete invoke is unfinished
            out.content += body[invokes[-1].end():].lstrip()
        return True

    def _arguments(self, name: str, parameters: str) -> dict[str, Any]:
        schemas = self._schemas.get(name, {})
        arguments: dict[str, Any] = {}
        for match in _PARAMETER.finditer(parameters):
            key, text = _name(match), match.group(4)
            if key:
                schema = schemas.get(key)
                if schema is None:
                    arguments[key] = json_or_text(text.strip())
                else:
                    kind, _ = schema_type(schema)
                    arguments[key] = typed_value(text if kind in STRING_TYPES else text.strip(), schema)
        return arguments


def _name(match: re.Match[str]) -> str:
    return (match.group(1) or match.group(2) or match.group(3) or "").strip()


def minimax_m2(prompt: str = "") -> ThinkParser:
    return ThinkParser(starts_in_reasoning=not prompt_closes_think(prompt),
                       content_starts=(MinimaxM2ToolParser.START,))
