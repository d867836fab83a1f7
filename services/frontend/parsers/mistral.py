"""The `mistral` tool-call parser: content, then `[TOOL_CALLS]` and the calls, in either of the
two formats Mistral's tokenizers were trained on. Runs in frontend API-server processes.

- v11 and later: `[TOOL_CALLS]NAME{arguments}` (or `NAME[ARGS]{arguments}`), repeated per call.
- before v11: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, a JSON array.

vLLM picks the format from the tokenizer's version; here it is read from the text: a `[` right
after `[TOOL_CALLS]` is the array. Call ids are 9 letters and digits, the form Mistral's templates
require. A call is sent whole once its arguments object closes and parses (the array's objects as
in json_calls.py). Where the model strays: a v11 name that is not followed by `{` (or is no name),
arguments that are no JSON object, or output that ends before the arguments close (cut by
max_tokens: finish_reason "length") is returned as content with its `[TOOL_CALLS]`, never as a call
the model did not finish; text after the calls is content, whitespace aside.
"""
from __future__ import annotations

import re
import secrets
import string

from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import AFTER, BETWEEN, CONTENT, START, JsonCallsParser
from services.frontend.parsers.json_scan import JsonScan, strict_json
from services.frontend.parsers.tags import held_suffix

__all__ = ["MistralToolParser", "mistral_call_id"]

BOT = "[TOOL_CALLS]"
_NAME = re.compile(r"([\w.\-]+)(?:\[ARGS\])?(?=\{)")
_NAME_PREFIX = re.compile(r"[\w.\-]*(?:\[A?R?G?S?\]?)?\Z")
_FORMAT, _NAME_, _ARGUMENTS, _NEXT = 10, 11, 12, 13
_ALPHABET = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(9))


class MistralToolParser(JsonCallsParser):
    """Content until `[TOOL_CALLS]`, then calls in the v11 or the array format."""

    __slots__ = ("_head", "_name")

    def __init__(self) -> None:
        super().__init__(separators=",", terminator="]", make_id=mistral_call_id)
        self._name = self._head = ""  # the v11 call being read: its name, and its text before the arguments

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase, buf = self._phase, self._buf
        if phase == START:
            start = buf.find(BOT)
            if start < 0:
                cut = len(buf) - (0 if final else held_suffix(buf, (BOT,)))
                out.content += buf[:cut]
                self._buf = buf[cut:]
                return False
            out.content += buf[:start]
            self._buf, self._phase = buf[start + len(BOT):], _FORMAT
        elif phase == _FORMAT:
            head = buf.lstrip()
            if not head:
                return False
            if head.startswith("["):
                self._opening = BOT + buf[:len(buf) - len(head) + 1]
                self._buf, self._phase = head[1:], BETWEEN
            else:
                self._buf, self._phase = head, _NAME_
        elif phase == _NAME_:
            name = _NAME.match(buf)
            if name is not None:
                self._name, self._head = name.group(1), BOT + buf[:name.end()]
                self._buf, self._phase, self._scan, self._scanned = buf[name.end():], _ARGUMENTS, JsonScan(), 0
            elif _NAME_PREFIX.match(buf) and not final:
                return False
            else:
                out.content += BOT
                self._phase = CONTENT
        elif phase == _ARGUMENTS:  # held until the object closes (one pass over a long one)
            end = self._scanned + self._scan.scan(buf[self._scanned:])
            self._scanned = end
            if not self._scan.closed:
                if not final:
                    return False
                out.content += self._head + buf
                self._buf, self._phase = "", CONTENT
                return True
            arguments, self._buf = buf[:end], buf[end:]
            if _is_object(arguments):
                self._open(out, self._name, arguments)
                self._phase = _NEXT
            else:
                out.content += self._head + arguments
                self._phase = CONTENT
        elif phase == _NEXT:
            head = buf.lstrip()
            self._buf = head
            if head.startswith(BOT):
                self._buf, self._phase = head[len(BOT):], _FORMAT
            elif not final and held_suffix(head, (BOT,)) == len(head):
                return False  # whitespace, or what may be the next [TOOL_CALLS]
            else:
                self._phase = AFTER
        else:
            return super()._step(out, final=final)
        return True


def _is_object(text: str) -> bool:
    try:
        return isinstance(strict_json(text), dict)
    except ValueError:
        return False
