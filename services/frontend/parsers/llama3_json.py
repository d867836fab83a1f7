"""The `llama3_json` tool-call parser (Llama 3.1-3.3, Llama 4 with the JSON template): an output
that begins with `<|python_tag|>` or `{` is calls, `{"name": ..., "parameters": {...}}` (or
"arguments"), several separated by `;`. Runs in frontend API-server processes.

As in vLLM's streaming path, only an output that starts that way (leading whitespace aside) is
read as calls; any other output is content, even if it contains JSON later (vLLM's non-streaming
path searches the whole text, which cannot be streamed consistently). The calls themselves, and
what happens to objects that are no call and to cut output, are as in json_calls.py.
"""
from __future__ import annotations

from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import BETWEEN, CONTENT, START, JsonCallsParser
from services.frontend.parsers.tags import held_suffix

__all__ = ["Llama3JsonToolParser"]

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(JsonCallsParser):
    """JSON calls at the start of the output to tool calls; anything else is content."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(separators=";")

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        if self._phase != START:
            return super()._step(out, final=final)
        head = self._buf.lstrip()
        if head.startswith(PYTHON_TAG):
            self._buf, self._phase = head[len(PYTHON_TAG):], BETWEEN
        elif head.startswith("{"):
            self._phase = BETWEEN
        elif not final and held_suffix(head, (PYTHON_TAG,)) == len(head):
            return False  # nothing yet but whitespace or a part of the tag
        else:
            self._phase = CONTENT
        return True
