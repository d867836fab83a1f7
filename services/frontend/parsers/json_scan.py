"""Finding where a JSON value ends in text that arrives in pieces: string, escape and bracket state
carried from one piece to the next. Used by the JSON tool-call parsers (frontend API servers)."""
from __future__ import annotations

__all__ = ["JsonScan"]


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
