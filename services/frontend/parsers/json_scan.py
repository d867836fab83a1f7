"""Finding where a JSON value ends in text that arrives in pieces: string, escape and bracket state
carried from one piece to the next; and reading that value strictly. Used by the JSON tool-call parsers
(frontend API servers)."""
from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["JsonScan", "strict_json"]


def strict_json(text: str) -> Any:
    """The JSON value `text` holds, as JSON has it: Python's NaN, Infinity and numbers past a float's
    range (1e400, which would come back out as Infinity) raise ValueError, so a call whose arguments
    hold one is no call (a strict client's JSON.parse would throw on them)."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal} is past a float's range")
    return value


class JsonScan:
    """Bracket depth outside strings, fed text in order.

    `scan` returns the index just past the bracket that brings the depth back to 0 (`closed` is
    then True), or, with `stop_at_lt`, the index of a `<` outside any string (`stopped`: never
    JSON, so the model left the value unclosed); else len(text), with the state kept for more.
    A scan made with `in_string` starts just past a string's opening quote and closes just past
    the quote that ends that string.
    """

    __slots__ = ("closed", "depth", "escaped", "in_string", "stopped", "string")

    def __init__(self, depth: int = 0, *, in_string: bool = False) -> None:
        self.depth = depth
        self.in_string = self.string = in_string
        self.escaped = False
        self.closed = self.stopped = False

    def scan(self, text: str, *, stop_at_lt: bool = False) -> int:
        depth, in_string, escaped, string = self.depth, self.in_string, self.escaped, self.string
        end = len(text)
        for i, ch in enumerate(text):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                    if string:
                        end = i + 1
                        self.closed = True
                        break
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth <= 0:
                    end = i + 1
                    self.closed = True
                    break
            elif ch == "<" and stop_at_lt:
                end = i
                self.stopped = True
                break
        self.depth, self.in_string, self.escaped = depth, in_string, escaped
        return end
