"""The `llama3_json` tool-call parser (Llama 3.1-3.3, Llama 4 with the JSON template): an output
that begins with `<|python_tag|>` or `{` is calls, `{"name": ..., "parameters": {...}}` (or
"arguments"), several separated by `;`. Runs in frontend API-server processes.

As in vLLM's streaming path, only an output that starts that way (leading whitespace aside) is
read as calls; any other output is content, even if it contains JSON later (vLLM's non-streaming
path searches the whole text, which cannot be streamed consistently). Arguments stream as the
model's own text once `{"name": "NAME", "parameters": ` has arrived, as in the hermes parser; an
object in another shape is parsed once it closes and sent in one delta as
`json.dumps(arguments, ensure_ascii=False)`. An object that is no call (a plain JSON answer) is
returned as content and so is everything after it; text after the calls is content, the `;` and
whitespace between them are dropped. Output cut before a call's name arrived is content; cut inside
the arguments, the call keeps what was streamed (then no complete JSON).
"""
from __future__ import annotations

import json
import re

from services.frontend.parsers.delta import ParsedDelta, ToolCall, ToolCallDelta, make_call_id
from services.frontend.parsers.json_scan import JsonScan
from services.frontend.parsers.tags import held_suffix

__all__ = ["Llama3JsonToolParser"]

PYTHON_TAG = "<|python_tag|>"
_HEADER = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_START, _BETWEEN, _HEADER_, _ARGUMENTS, _TAIL, _CONTENT = range(6)


class Llama3JsonToolParser:
    """JSON calls at the start of the output to tool calls; anything else is content."""

    __slots__ = ("_buf", "_calls", "_phase", "_scan")

    def __init__(self) -> None:
        self._buf = ""
        self._phase = _START
        self._scan = JsonScan()
        self._calls: list[ToolCall] = []

    def push(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        self._run(out, final=False)
        return out

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        self._run(out, final=True)
        return out

    def calls(self) -> list[ToolCall]:
        return list(self._calls)

    def _run(self, out: ParsedDelta, *, final: bool) -> None:
        while True:
            phase = self._phase
            if phase == _START:
                head = self._buf.lstrip()
                if head.startswith(PYTHON_TAG):
                    self._buf, self._phase = head[len(PYTHON_TAG):], _BETWEEN
                elif head.startswith("{"):
                    self._phase = _BETWEEN
                elif not final and held_suffix(head, (PYTHON_TAG,)) == len(head):
                    return  # nothing yet but whitespace or a part of the tag
                else:
                    self._phase = _CONTENT
            elif phase == _BETWEEN:
                head = self._buf.lstrip("; \t\r\n")
                self._buf = head
                if not head:
                    return
                self._phase = _HEADER_ if head.startswith("{") else _CONTENT
                self._scan = JsonScan()
            elif phase == _HEADER_:
                header = _HEADER.match(self._buf)
                if header is not None:
                    self._open(out, json.loads(header.group(1)), "")
                    self._buf = self._buf[header.end():]
                    self._phase, self._scan = _ARGUMENTS, JsonScan()
                    continue
                if not self._whole(out, final=final):
                    return
            elif phase == _ARGUMENTS:
                end = self._scan.scan(self._buf)
                self._add_arguments(out, self._buf[:end])
                self._buf = self._buf[end:]
                if not self._scan.closed:
                    return
                self._phase, self._scan = _TAIL, JsonScan(depth=1)
            elif phase == _TAIL:  # the rest of the call's object is framing: skip to its close
                end = self._scan.scan(self._buf)
                self._buf = self._buf[end:]
                if not self._scan.closed:
                    return
                self._phase = _BETWEEN
            else:
                out.content += self._buf
                self._buf = ""
                return

    def _whole(self, out: ParsedDelta, *, final: bool) -> bool:
        """An object not in the streamable shape: parse it once it closes; False while it is open."""
        scan = JsonScan()
        end = scan.scan(self._buf)
        if not scan.closed:
            if not final:
                return False
            out.content += self._buf  # cut before it was a call
            self._buf, self._phase = "", _CONTENT
            return True
        text, self._buf = self._buf[:end], self._buf[end:]
        call = _parse_call(text)
        if call is None:
            out.content += text
            self._phase = _CONTENT
        else:
            self._open(out, *call)
            self._phase = _BETWEEN
        return True

    def _open(self, out: ParsedDelta, name: str, arguments: str) -> None:
        call = ToolCall(make_call_id(), name, arguments)
        out.tool_calls.append(ToolCallDelta(len(self._calls), call.id, name, arguments))
        self._calls.append(call)

    def _add_arguments(self, out: ParsedDelta, text: str) -> None:
        if not text:
            return
        index = len(self._calls) - 1
        self._calls[index].arguments += text
        last = out.tool_calls[-1] if out.tool_calls else None
        if last is not None and last.index == index:
            last.arguments += text
        else:
            out.tool_calls.append(ToolCallDelta(index, None, None, text))


def _parse_call(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of an object that is one call, else None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters"))
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)
