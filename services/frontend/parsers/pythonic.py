"""The `pythonic` tool-call parser (Llama 3.2, Llama 4, ToolACE): an output that is a Python list
of calls, `[get_weather(city="Paris", days=3), ping()]`. Runs in frontend API-server processes.

As in vLLM, only an output that begins with `[` (leading whitespace aside) can be calls, and only
keyword arguments count (vLLM ignores positional ones too). A call is sent once `NAME(` has arrived;
its arguments are the JSON object of the keyword values, streamed as `{`, then `"k": value` (`, `
between) as each value completes, then `}`; a value is a Python literal (str, number, bool, None,
list, tuple, dict) turned into JSON. Where the model strays: text that stops looking like a list of
calls before a call was sent is content, all of it; after a call, what follows the list (or what
breaks it) is content, whitespace aside. A value that is no literal is passed as its source text
(vLLM would return the whole output as content, which cannot be done once the call is sent). A cut
output completes the open call with the values that were complete (a half value is dropped).
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id
from services.frontend.parsers.tags import BufferedParser

__all__ = ["PythonicToolParser"]

_CALL = re.compile(r"[\[,]\s*([A-Za-z_]\w*)\s*\(")
_CALL_PREFIX = re.compile(r"[\[,]\s*(?:[A-Za-z_]\w*\s*)?\Z")
_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)\s*")
_KEYWORD_PREFIX = re.compile(r"\s*(?:[A-Za-z_]\w*\s*)?\Z")
_START, _NAME, _KEYWORDS, _VALUE, _AFTER_CALL, _AFTER_LIST, _CONTENT = range(7)
_CLOSING = {"(": ")", "[": "]", "{": "}"}


class PythonicToolParser(BufferedParser):
    """A leading Python list of calls to tool calls; anything else is content."""

    __slots__ = ("_calls", "_count", "_keyword", "_phase", "_quote", "_scanned", "_stack")

    def __init__(self) -> None:
        super().__init__()
        self._phase = _START
        self._calls = CallLog()
        self._count = 0  # keyword values sent for the open call
        self._keyword: str | None = None
        self._stack: list[str] = []  # open brackets inside the value being scanned
        self._quote = ""  # the open string's quote, or "" outside strings
        self._scanned = 0  # how much of _buf the value scan has read

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        while True:
            phase, buf = self._phase, self._buf
            if phase == _START:
                head = buf.lstrip()
                if head.startswith("["):
                    self._buf, self._phase = head, _NAME
                elif head or final:
                    self._phase = _CONTENT
                else:
                    return False
            elif phase == _NAME:  # at "[" or ",": the next element must be a call
                call = _CALL.match(buf)
                if call is not None:
                    self._open(out, call.group(1))
                    self._buf, self._phase = buf[call.end():], _KEYWORDS
                elif _CALL_PREFIX.match(buf) and not final:
                    return False
                else:
                    self._phase = _CONTENT
            elif phase == _KEYWORDS:
                head = buf.lstrip()
                keyword = _KEYWORD.match(buf)
                if head.startswith(")"):
                    self._close(out)
                    self._buf, self._phase = head[1:], _AFTER_CALL
                elif keyword is not None:
                    self._keyword = keyword.group(1)
                    self._buf = buf[keyword.end():]
                    self._begin_value()
                elif final:
                    self._close(out)
                    self._buf, self._phase = "", _AFTER_CALL
                elif _KEYWORD_PREFIX.match(buf):
                    return False
                else:  # a positional argument: scanned past and dropped, as vLLM ignores it
                    self._keyword = None
                    self._begin_value()
            elif phase == _VALUE:
                end = self._scan_value()
                if end < 0:
                    if not final:
                        return False
                    self._buf, self._phase = "", _KEYWORDS  # cut: the half value is dropped
                    continue
                self._add_value(out, buf[:end])
                self._buf = buf[end + 1:] if buf[end] == "," else buf[end:]
                self._phase = _KEYWORDS
            elif phase == _AFTER_CALL:
                head = buf.lstrip()
                if head.startswith(","):
                    self._buf, self._phase = head, _NAME
                elif head.startswith("]"):
                    self._buf, self._phase = head[1:], _AFTER_LIST
                elif head:
                    self._buf, self._phase = head, _CONTENT
                else:
                    self._buf = ""
                    return False
            elif phase == _AFTER_LIST:
                self._buf = buf.lstrip()
                if not self._buf:
                    return False
                self._phase = _CONTENT
            else:
                out.content += buf
                self._buf = ""
                return False

    def _begin_value(self) -> None:
        self._phase = _VALUE
        self._stack, self._quote, self._scanned = [], "", 0

    def _scan_value(self) -> int:
        """The index of the `,` or `)` that ends the value in `_buf`, or -1 while it is open."""
        buf, stack, quote = self._buf, self._stack, self._quote
        i = self._scanned
        while i < len(buf):
            ch = buf[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in _CLOSING:
                stack.append(_CLOSING[ch])
            elif stack and ch == stack[-1]:
                stack.pop()
            elif not stack and ch in ",)":
                self._quote = ""
                return i
            i += 1
        # An escape at the very end is read again with the character it escapes.
        self._scanned, self._quote = min(i, len(buf)) - (1 if i > len(buf) else 0), quote
        return -1

    def _open(self, out: ParsedDelta, name: str) -> None:
        self._calls.open(out, make_call_id(), name, "{")
        self._count = 0

    def _close(self, out: ParsedDelta) -> None:
        self._calls.add(out, "}")

    def _add_value(self, out: ParsedDelta, source: str) -> None:
        if self._keyword is None:
            return
        sep = ", " if self._count else ""
        self._count += 1
        self._calls.add(out, f"{sep}{json.dumps(self._keyword, ensure_ascii=False)}: {_json_value(source)}")


def _json_value(source: str) -> str:
    """A Python literal's JSON text; a value that is no literal is kept as its source string."""
    source = source.strip()
    try:
        value: Any = ast.literal_eval(source)
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return json.dumps(source, ensure_ascii=False)
