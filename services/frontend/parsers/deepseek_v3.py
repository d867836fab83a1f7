"""The `deepseek_v3` and `deepseek_v31` tool-call parsers (DeepSeek-V3/R1-0528 and DeepSeek-V3.1):
calls in a `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>` section. Runs in frontend API-server processes.

deepseek_v3: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`;
deepseek_v31: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`. The bars are fullwidth
(U+FF5C) and the spaces U+2581, as in the tokenizers' special tokens. The calls get OpenAI-style
ids. The section frame (`call_sections`) says what happens to stray, malformed and cut output; here,
a deepseek_v3 header without `<｜tool▁sep｜>` before its newline is no header, and the call is dropped.
"""
from __future__ import annotations

from services.frontend.parsers.call_sections import CallSectionParser
from services.frontend.parsers.delta import make_call_id

__all__ = ["DeepSeekV31ToolParser", "DeepSeekV3ToolParser"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class DeepSeekV3ToolParser(CallSectionParser):
    """`TYPE<｜tool▁sep｜>NAME` on the header line, then the arguments in a ```json fence."""

    SECTION_BEGIN = (CALLS_BEGIN,)
    SECTION_END = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    CALL_END = CALL_END
    HEADER_END = "\n"
    ARGUMENTS_PREFIX = "```json"
    ARGUMENTS_SUFFIX = "```"

    __slots__ = ()

    def _header(self, header: str) -> tuple[str, str] | None:
        _, sep, name = header.partition(SEP)
        name = name.strip()
        return (name, make_call_id()) if sep and name else None


class DeepSeekV31ToolParser(CallSectionParser):
    """`NAME<｜tool▁sep｜>` then the arguments."""

    SECTION_BEGIN = (CALLS_BEGIN,)
    SECTION_END = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    CALL_END = CALL_END
    HEADER_END = SEP

    __slots__ = ()

    def _header(self, header: str) -> tuple[str, str] | None:
        name = header.strip()
        return (name, make_call_id()) if name else None
