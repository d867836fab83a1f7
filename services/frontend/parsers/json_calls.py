"""The frame shared by tool parsers whose calls are bare JSON objects, `{"name": ..., "arguments":
{...}}`, one after another (llama3_json, mistral's JSON array). Runs in frontend API-server processes.

Each object is held until it closes and is then parsed whole: an object that is one call is sent
in one delta, arguments `json.dumps(arguments, ensure_ascii=False)` (as vLLM sends them), so a call
that was sent is never one the model did not finish. An object that is no call (bad JSON, no name,
arguments no object) is returned as content, and so is an object the output ends inside of (cut by
max_tokens: the client gets the text and finish_reason "length"). Separators and whitespace between
calls are dropped; what a subclass does with other text is its own (phase CONTENT).
"""
from __future__ import annotations

import json
from collections.abc import Callable

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id
from services.frontend.parsers.json_scan import JsonScan, strict_json
from services.frontend.parsers.tags import BufferedParser

__all__ = ["JsonCallsParser", "parse_call"]

START, BETWEEN, OBJECT, AFTER, CONTENT = range(5)


class JsonCallsParser(BufferedParser):
    """JSON call objects; a subclass decides in `_step` where they begin (phase START)."""

    __slots__ = ("_calls", "_make_id", "_opening", "_phase", "_scan", "_scanned", "_separators", "_terminator")

    def __init__(self, *, separators: str, terminator: str = "",
                 make_id: Callable[[], str] = make_call_id) -> None:
        super().__init__()
        self._phase = START
        self._scan = JsonScan()
        self._scanned = 0  # how much of `_buf` the scan of an object in another shape has read
        self._calls = CallLog()
        self._separators = separators + " \t\r\n"
        self._terminator = terminator  # ends the calls (mistral's "]"); "" for none
        self._make_id = make_id
        # The text that opened the calls (a marker and an array's "["), set by a subclass that drops it: put
        # back before the content when no call came of them (a malformed or cut first object).
        self._opening = ""

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        """Advance one phase; False when it needs more text (or, at flush, is done)."""
        phase = self._phase
        if phase == BETWEEN:
            head = self._buf.lstrip(self._separators)
            self._buf = head
            if not head:
                return False
            if self._terminator and head.startswith(self._terminator):
                self._buf, self._phase = head[len(self._terminator):], AFTER
            else:
                self._phase = OBJECT if head.startswith("{") else CONTENT
                self._scan, self._scanned = JsonScan(), 0
        elif phase == OBJECT:
            return self._whole(out, final=final)
        elif phase == AFTER:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._phase = CONTENT
        elif phase == CONTENT:
            out.content += self._buf
            self._buf = ""
            return False
        else:
            raise AssertionError(f"phase {phase} belongs to the subclass")
        return True

    def _whole(self, out: ParsedDelta, *, final: bool) -> bool:
        """The object at `_buf`'s start: parse it once it closes; False while it is open."""
        at = len(out.content)
        done = self._object(out, final=final)
        if self._phase == CONTENT and not len(self._calls) and self._opening:  # no call at all: all of it is text
            out.content = out.content[:at] + self._opening + out.content[at:]
            self._opening = ""
        return done

    def _object(self, out: ParsedDelta, *, final: bool) -> bool:
        scan = self._scan  # read on from where the last push left it: one pass over a long object
        end = self._scanned + scan.scan(self._buf[self._scanned:])
        self._scanned = end
        if not scan.closed:
            if not final:
                return False
            out.content += self._buf  # the output ended inside it: no call
            self._buf, self._phase = "", CONTENT
            return True
        text, self._buf = self._buf[:end], self._buf[end:]
        call = parse_call(text)
        if call is None:
            out.content += text
            self._phase = CONTENT
        else:
            self._open(out, *call)
            self._phase = BETWEEN
        return True

    def _open(self, out: ParsedDelta, name: str, arguments: str) -> None:
        self._calls.open(out, self._make_id(), name, arguments)


def parse_call(text: str, *, parameters: bool = True) -> tuple[str, str] | None:
    """(name, arguments JSON) of an object that is one call, else None. Its arguments are an object,
    or a JSON string of one, under "arguments" (or, with `parameters`, "parameters" when there is no
    "arguments")."""
    try:
        obj = strict_json(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters") if parameters else None)
    if isinstance(arguments, str):
        try:
            arguments = strict_json(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)
