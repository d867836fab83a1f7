"""The `granite` tool-call parser (IBM Granite 3.0, 3.1): content, then `<|tool_call|>` (3.0, a
special token) or `<tool_call>` (3.1, text) and a JSON array of calls, `[{"name": ..., "arguments":
{...}}, ...]`. Runs in frontend API-server processes.

The calls are read as mistral's array format is (json_calls.py): each object is sent whole once it
closes and parses; an object that is no call, or one the output ends inside of, is content as the
model wrote it, with the rest of the output (the marker and the array's `[` before it are framing).
vLLM sends such an object as a call with its broken text as arguments. A marker not followed by `[`
is content, marker included; text after the array is content, whitespace aside.
"""
from __future__ import annotations

from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import BETWEEN, CONTENT, START, JsonCallsParser
from services.frontend.parsers.tags import held_suffix

__all__ = ["MARKERS", "GraniteToolParser"]

MARKERS = ("<|tool_call|>", "<tool_call>")
_ARRAY = 20  # after a marker: is a `[` next?


class GraniteToolParser(JsonCallsParser):
    """Content until a marker, then a JSON array of calls."""

    __slots__ = ("_marker",)

    def __init__(self) -> None:
        super().__init__(separators=",", terminator="]")
        self._marker = ""

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase, buf = self._phase, self._buf
        if phase == START:
            found = [(at, tag) for tag in MARKERS if (at := buf.find(tag)) >= 0]
            if not found:
                cut = len(buf) - (0 if final else held_suffix(buf, MARKERS))
                out.content += buf[:cut]
                self._buf = buf[cut:]
                return False
            at, self._marker = min(found)
            out.content += buf[:at]
            self._buf, self._phase = buf[at + len(self._marker):], _ARRAY
        elif phase == _ARRAY:
            head = buf.lstrip()
            if not head and not final:
                return False
            if head.startswith("["):
                self._buf, self._phase = head[1:], BETWEEN
            else:
                out.content += self._marker
                self._phase = CONTENT
        else:
            return super()._step(out, final=final)
        return True
