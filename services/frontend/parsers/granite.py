"""The `granite` tool-call parser (IBM Granite 3.0, 3.1): content, then `<|tool_call|>` (3.0, a
special token) or `<tool_call>` (3.1, text) and a JSON array of calls, `[{"name": ..., "arguments":
{...}}, ...]`; and `phi4_mini_json`, the same after `functools`. Runs in frontend API-server processes.

The calls are read as mistral's array format is (json_calls.py): each object is sent whole once it
closes and parses; an object that is no call, or one the output ends inside of, is content as the
model wrote it, with the rest of the output (and with the marker and the `[` before it when no call
came before it). vLLM's granite sends such an object as a call with its broken text as arguments.
A call is complete when its object closes: an array never closed still gives its calls. A marker not followed by `[`
is content, marker included; text after the array is content, whitespace aside.
"""
from __future__ import annotations

from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import BETWEEN, CONTENT, START, JsonCallsParser
from services.frontend.parsers.tags import held_suffix

__all__ = ["MARKERS", "GraniteToolParser", "Phi4MiniJsonToolParser"]

MARKERS = ("<|tool_call|>", "<tool_call>")
_ARRAY = 20  # after a marker: is a `[` next?


class GraniteToolParser(JsonCallsParser):
    """Content until a marker, then a JSON array of calls."""

    MARKERS: tuple[str, ...] = MARKERS

    __slots__ = ("_marker",)

    def __init__(self) -> None:
        super().__init__(separators=",", terminator="]")
        self._marker = ""

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase, buf = self._phase, self._buf
        if phase == START:
            found = [(at, tag) for tag in self.MARKERS if (at := buf.find(tag)) >= 0]
            if not found:
                cut = len(buf) - (0 if final else held_suffix(buf, self.MARKERS))
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
                self._opening = self._marker + buf[:len(buf) - len(head) + 1]
                self._buf, self._phase = head[1:], BETWEEN
            else:
                out.content += self._marker
                self._phase = CONTENT
        else:
            return super()._step(out, final=final)
        return True


class Phi4MiniJsonToolParser(GraniteToolParser):
    """`phi4_mini_json` (Phi-4-mini): the same array after `functools`, as vLLM reads it (which cuts
    the array at its first `]`, even one inside a string or a nested array; this parser reads the
    JSON)."""

    MARKERS = ("functools",)

    __slots__ = ()
