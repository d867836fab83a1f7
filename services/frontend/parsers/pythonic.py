"""The `pythonic` tool-call parser (Llama 3.2, Llama 4, ToolACE): an output that is a Python list
of calls, `[get_weather(city="Paris", days=3), ping()]`. Runs in frontend API-server processes.

As in vLLM, only an output that begins with `[` (leading whitespace aside) can be calls. Arguments are
keywords: a call with a positional argument or a keyword repeated is no call (vLLM drops the first and
keeps the last of the second, which sends arguments other than the model wrote). The list is held until
its closing `]` and then read whole: when it is a list of calls whose keyword values are all
literals (str, number, bool, None, and lists, tuples and dicts of them; JSON's null, true and
false too, as vLLM reads them), the calls are sent, each in one delta, with the JSON object of the
keyword values as arguments. Anything else is content, all of it, as vLLM returns it: a list that
is no list of calls, a value that is no literal, a list the output ends inside of (a model that
stopped early, or one cut by max_tokens: the client gets the text and finish_reason "length").
Text that stops looking like the start of a call list (`[1] See...`) is released as content at
once. Unlike vLLM (which returns the whole output as content when text follows the list), text after
the list is content and the calls stay calls: they were sent when the list closed.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id
from services.frontend.parsers.tags import BufferedParser

__all__ = ["PythonicToolParser"]

# What the held text must keep looking like: "[", then a (dotted) name and its "(", or less of it.
_CALL_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*(?:\(|\Z)|\Z)")
_START, _LIST, _AFTER_LIST, _CONTENT = range(4)
_CLOSING = {"(": ")", "[": "]", "{": "}"}
_JSON_NAMES = {"null": None, "true": True, "false": False}


class _NotACall(ValueError):
    pass


class PythonicToolParser(BufferedParser):
    """A leading Python list of calls to tool calls; anything else is content."""

    __slots__ = ("_calls", "_phase", "_quote", "_scanned", "_stack")

    def __init__(self) -> None:
        super().__init__()
        self._phase = _START
        self._calls = CallLog()
        self._stack: list[str] = []  # closers of the brackets open in the list
        self._quote = ""  # the open string's quote, or "" outside strings
        self._scanned = 0  # how much of _buf the scan has read

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase, buf = self._phase, self._buf
        if phase == _START:
            head = buf.lstrip()
            if head.startswith("["):
                self._buf, self._phase = head, _LIST
            elif head or final:
                self._phase = _CONTENT
            else:
                return False
        elif phase == _LIST:
            end = self._scan()
            if end < 0:
                if not final and _CALL_START.match(buf[:self._scanned + 1]):
                    return False
                self._phase = _CONTENT  # no call list (or one the output ended inside of): text
                return True
            try:
                calls = _read_calls(buf[:end])
            except (_NotACall, SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
                self._phase = _CONTENT
                return True
            for name, arguments in calls:
                self._calls.open(out, make_call_id(), name, arguments)
            self._buf, self._phase = buf[end:], _AFTER_LIST
        elif phase == _AFTER_LIST:
            self._buf = buf.lstrip()
            if not self._buf:
                return False
            self._phase = _CONTENT
        else:
            out.content += buf
            self._buf = ""
            return False
        return True

    def _scan(self) -> int:
        """The index just past the `]` that closes the list in `_buf`, or -1 while it is open."""
        buf, stack, quote = self._buf, self._stack, self._quote
        i = self._scanned
        while i < len(buf):
            ch = buf[i]
            if quote:
                if ch == "\\":
                    if i + 1 == len(buf):
                        break  # read the escape again with the character it escapes
                    i += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in _CLOSING:
                stack.append(_CLOSING[ch])
            elif stack and ch == stack[-1]:
                stack.pop()
                if not stack:
                    return i + 1
            elif ch in ")]}":
                return i + 1  # a closer that closes nothing: no Python, read as such
            i += 1
        self._scanned, self._quote = i, quote
        return -1


def _read_calls(source: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) of each call of a Python list of calls; _NotACall (or SyntaxError) else."""
    tree = ast.parse(source, mode="eval").body
    if not isinstance(tree, ast.List) or not tree.elts:
        raise _NotACall(source)
    calls = []
    for call in tree.elts:
        if not isinstance(call, ast.Call):
            raise _NotACall(source)
        if call.args:  # positional: no name to give it in a JSON object
            raise _NotACall(source)
        arguments = {}
        for keyword in call.keywords:
            if keyword.arg is None or keyword.arg in arguments:  # **kwargs, or a keyword repeated
                raise _NotACall(source)
            arguments[keyword.arg] = _literal(keyword.value)
        calls.append((_dotted(call.func), json.dumps(arguments, ensure_ascii=False, allow_nan=False)))
    return calls


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise _NotACall(ast.dump(node))


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        keys = [_literal(key) for key in node.keys if key is not None]
        if not all(isinstance(key, str) for key in keys):
            raise _NotACall(ast.dump(node))
        return dict(zip(keys, (_literal(value) for value in node.values), strict=True))
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    raise _NotACall(ast.dump(node))
