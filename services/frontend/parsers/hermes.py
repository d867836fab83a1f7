"""The `hermes` tool-call parser (Hermes 2 Pro, Qwen2.5, Qwen3): each call is a JSON object in
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. Runs in frontend API-server processes.

A call is sent whole, in one delta (id, name and arguments), once its block has ended (at
`</tool_call>`, at the next `<tool_call>`, or at the end of the output) and its body has parsed as
one call: a call that was sent is never one the model did not finish. A tag inside a JSON string
is argument text, not the end of the block. Arguments are `json.dumps(arguments, ensure_ascii=False)`
of the model's object (a JSON string holding an object is read as that object), as vLLM sends them.

Where the model strays, as vLLM's non-streamed parser: a body that is no call (bad JSON, no name,
arguments no object, text after the object) is returned as content, tags included, and so is a
block that the output ends inside of before its JSON is complete (cut by max_tokens: the client gets
the text and finish_reason "length"). Unlike vLLM, which then returns the whole output as content,
the calls of the other blocks stay calls (streaming has sent them already), and text after the calls
is content, not dropped.
"""
from __future__ import annotations

from services.frontend.parsers.call_blocks import CallBlockParser
from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import parse_call

__all__ = ["HermesToolParser"]


class HermesToolParser(CallBlockParser):
    """`<tool_call>` JSON blocks to tool calls, each sent once its block has ended and parsed."""

    __slots__ = ("_escaped", "_in_string", "_scanned")

    def __init__(self) -> None:
        super().__init__()
        self._begin()

    def _begin(self) -> None:
        self._scanned = 0  # how much of the body `_buf` holds has been read for the block's end
        self._in_string = self._escaped = False

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        end, after = self._block_end(final=final)
        if end < 0:
            return False
        body, self._buf = self._buf[:end], self._buf[after:]
        call = parse_call(body, parameters=False)
        if call is None:
            out.content += self.START + body + ("" if after == end else self.END)
        else:
            self._open_call(out, *call)
        return True

    def _block_end(self, *, final: bool) -> tuple[int, int]:
        """(where the body ends, where the text after the block starts), or (-1, -1) while open.
        A `<` outside a JSON string that begins `</tool_call>` or `<tool_call>` ends it."""
        buf, i = self._buf, self._scanned
        in_string, escaped = self._in_string, self._escaped
        while i < len(buf):
            ch = buf[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "<":
                rest = buf[i:i + len(self.END)]
                if rest == self.END:
                    return i, i + len(self.END)
                if rest.startswith(self.START):
                    return i, i
                partial = len(rest) < len(self.END) and (self.END.startswith(rest) or self.START.startswith(rest))
                if partial and not final:
                    break  # maybe a tag: read it again with more text
            i += 1
        self._scanned, self._in_string, self._escaped = i, in_string, escaped
        if final:
            return len(buf), len(buf)
        return -1, -1
