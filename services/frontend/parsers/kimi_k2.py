"""The `kimi_k2` tool-call and reasoning parsers (Kimi-K2, K2-Thinking). Runs in frontend
API-server processes.

Tool calls sit in `<|tool_calls_section_begin|>...<|tool_calls_section_end|>` (the singular
`<|tool_call_section_begin|>` / `_end|>` variants too, as vLLM accepts them), each
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`. The call
id is the model's own `functions.NAME:IDX` (passed on as is, as vLLM does, so a model that repeats
an id repeats it to the client); the name is the part before the first `:`, after its last `.`.
A header that is not `ID:DIGITS` is no header and its call is dropped. The section frame
(`call_sections`) says what happens to stray, malformed and cut output.

Reasoning: `[<think>]reasoning</think>content`. As in vLLM thinking is on by default, so the output
starts in reasoning, unless the rendered prompt ends with a closed `<think></think>` (the template
with thinking switched off), when it is all content. Opening the tool-call section also ends the
reasoning, and the content begins at it; without either, all of the output is reasoning.
"""
from __future__ import annotations

import re

from services.frontend.parsers.call_sections import CallSectionParser
from services.frontend.parsers.think import ThinkParser, prompt_closes_think

__all__ = ["KimiK2ToolParser", "kimi_k2"]

SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
_CALL_ID = re.compile(r"[^<]+:\d+")


class KimiK2ToolParser(CallSectionParser):
    """Kimi-K2 tool-call sections; each call keeps the id the model gave it."""

    SECTION_BEGIN = SECTION_BEGIN
    SECTION_END = SECTION_END
    CALL_BEGIN = CALL_BEGIN
    CALL_END = CALL_END
    HEADER_END = ARGUMENT_BEGIN

    __slots__ = ()

    def _header(self, header: str) -> tuple[str, str] | None:
        call_id = header.strip()
        if _CALL_ID.fullmatch(call_id) is None:
            return None
        name = call_id.partition(":")[0].rpartition(".")[2]
        return (name, call_id) if name else None


def kimi_k2(prompt: str = "") -> ThinkParser:
    return ThinkParser(starts_in_reasoning=not prompt_closes_think(prompt), content_starts=SECTION_BEGIN)
