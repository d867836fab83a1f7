"""The frame shared by reasoning parsers that mark reasoning with `<think>...</think>`: reasoning
until `</think>`, content after it. Runs in frontend API-server processes."""
from __future__ import annotations

from services.frontend.parsers.delta import ParsedDelta, ToolCall
from services.frontend.parsers.tags import BufferedParser, held_suffix

__all__ = ["ThinkParser", "prompt_closes_think", "prompt_opens_think"]

START = "<think>"
END = "</think>"
TOOL_CALL = "<tool_call>"
FUNCTION = "<function="
_OPENING, _REASONING, _CLOSED, _CONTENT = 0, 1, 2, 3


def prompt_opens_think(prompt: str, start: str = START, end: str = END) -> bool:
    """Whether the rendered prompt ends inside a `<think>` it opened (the generation prompt of
    templates that start the model's reasoning for it)."""
    return prompt.rfind(start) > prompt.rfind(end)


def prompt_closes_think(prompt: str) -> bool:
    """Whether the rendered prompt ends with a closed, `...</think>`, block (the generation prompt
    of templates with thinking switched off)."""
    return prompt.rstrip().endswith(END)


class ThinkParser(BufferedParser):
    """`[<think>]reasoning</think>content`.

    At the start the parser looks for a `<think>` the model writes itself (leading whitespace
    before it is dropped). Without one the output is reasoning when `starts_in_reasoning` (the
    prompt opened it), else all of it is content. A `<think>` later in the output is text.
    Whitespace right after `</think>` (the template's separator) is dropped, so a reply that is
    only tool calls has no content "\\n\\n"; vLLM keeps it. Without `</think>` the reasoning runs
    to the end of the output (vLLM: a truncated reasoning is all reasoning).

    With `tool_call_ends`, a `<tool_call>` followed (whitespace aside) by `<function=` also ends
    the reasoning, and the content begins at it: Qwen3.5 may call a tool without closing its
    reasoning. A `<tool_call>` followed by anything else is reasoning text. Each tag in
    `content_starts` ends the reasoning too, and the content begins at it (Kimi-K2 opening its
    tool-call section without closing its reasoning).
    """

    __slots__ = ("_default", "_end", "_ends", "_start", "_starts", "_state", "_tool_call_ends")

    def __init__(self, *, starts_in_reasoning: bool, tool_call_ends: bool = False,
                 content_starts: tuple[str, ...] = (), tags: tuple[str, str] = (START, END)) -> None:
        super().__init__()
        self._start, self._end = tags  # another family's spelling of <think> and </think>
        self._state = _OPENING
        self._default = _REASONING if starts_in_reasoning else _CONTENT
        self._tool_call_ends = tool_call_ends
        self._starts = content_starts
        self._ends = (self._end, *((TOOL_CALL,) if tool_call_ends else ()), *content_starts)

    def calls(self) -> list[ToolCall]:
        return []

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        if self._state == _OPENING:
            buf = self._buf
            head = buf.lstrip()
            if head.startswith(self._start):
                self._buf = head[len(self._start):]
                self._state = _REASONING
            elif self._start.startswith(head) and not final:
                return False  # still "", whitespace or a prefix of <think>
            else:
                self._state = self._default
        if self._state == _REASONING:
            buf = self._buf
            end = buf.find(self._end)
            call, undecided = self._tool_call(final=final)
            if call >= 0 and (end < 0 or call < end):
                out.reasoning += buf[:call]
                self._buf = buf[call:]
                self._state = _CONTENT
            elif end >= 0:
                out.reasoning += buf[:end]
                self._buf = buf[end + len(self._end):]
                self._state = _CLOSED
            else:
                cut = len(buf) - (0 if final else held_suffix(buf, self._ends))
                cut = min(cut, undecided) if undecided >= 0 else cut
                out.reasoning += buf[:cut]
                self._buf = buf[cut:]
                return False
        if self._state == _CLOSED:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = _CONTENT
        out.content += self._buf
        self._buf = ""
        return False

    def _tool_call(self, *, final: bool) -> tuple[int, int]:
        """(where a tag that ends the reasoning and begins the content is in `_buf`, where a
        `<tool_call>` begins that may still be one when more text comes); -1 for none."""
        buf = self._buf
        found = [at for tag in self._starts if (at := buf.find(tag)) >= 0]
        start = min(found, default=-1)
        if not self._tool_call_ends:
            return start, -1
        pos = 0
        while (at := buf.find(TOOL_CALL, pos)) >= 0 and (start < 0 or at < start):
            rest = buf[at + len(TOOL_CALL):].lstrip()
            if rest.startswith(FUNCTION):
                return at, -1
            if not final and FUNCTION.startswith(rest):
                return start, at
            pos = at + 1
        return start, -1
