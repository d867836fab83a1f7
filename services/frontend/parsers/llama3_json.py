"""The `llama3_json` tool-call parser (Llama 3.1-3.3, Llama 4 with the JSON template): calls are
JSON objects `{"name": ..., "parameters": {...}}` (or "arguments"), several separated by `;`,
optionally after `<|python_tag|>`. Runs in frontend API-server processes.

Calls are read wherever they are in the output, and the text around them is content: a model that
writes "Let me look that up." before its call gets the call run and its words shown. (vLLM's two
paths disagree here: its non-streamed parser extracts the calls anywhere and drops all the text; its
streamed one reads calls only when the output starts with one. This parser gives both what a user
wants, the call and the text, streamed and not alike.) A `{` followed, whitespace aside, by `"`
starts an object that is held until it closes: an object that is one call is sent (json_calls.py),
any other is content as written, so a JSON answer costs only the wait for its closing brace; a `{`
followed by anything else is content at once. `<|python_tag|>` is framing and dropped.
"""
from __future__ import annotations

from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import BETWEEN, CONTENT, START, JsonCallsParser
from services.frontend.parsers.json_scan import JsonScan
from services.frontend.parsers.tags import held_suffix

__all__ = ["Llama3JsonToolParser"]

PYTHON_TAG = "<|python_tag|>"
_OBJECT_START = 20  # at a `{`: is it followed by `"`?


class Llama3JsonToolParser(JsonCallsParser):
    """JSON calls anywhere in the output to tool calls; the text around them is content."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(separators=";")

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase = self._phase
        if phase == START:  # the output's leading whitespace is dropped when calls follow it
            head = self._buf.lstrip()
            if not head and not final:
                return False
            if head.startswith(("{", PYTHON_TAG)):
                self._buf = head
            self._phase = CONTENT
            return True
        if phase == _OBJECT_START:
            head = self._buf[1:].lstrip()
            if not head and not final:
                return False
            if head.startswith('"'):
                self._phase = BETWEEN  # which reads the object (and drops separators after it)
            else:
                out.content += "{"
                self._buf, self._phase = self._buf[1:], CONTENT
            return True
        if phase != CONTENT:
            return super()._step(out, final=final)
        buf = self._buf
        brace, tag = buf.find("{"), buf.find(PYTHON_TAG)
        if tag >= 0 and (brace < 0 or tag < brace):
            out.content += buf[:tag]
            self._buf, self._phase = buf[tag + len(PYTHON_TAG):], BETWEEN
            self._scan, self._scanned = JsonScan(), 0
            return True
        if brace >= 0:
            out.content += buf[:brace]
            self._buf, self._phase = buf[brace:], _OBJECT_START
            return True
        cut = len(buf) - (0 if final else held_suffix(buf, (PYTHON_TAG,)))
        out.content += buf[:cut]
        self._buf = buf[cut:]
        return False
