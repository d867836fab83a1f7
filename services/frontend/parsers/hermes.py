"""The `hermes` tool-call parser (Hermes 2 Pro, Qwen2.5, Qwen3): each call is a JSON object in
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. Runs in frontend API-server processes.

Streaming: once `{"name": "NAME", "arguments": ` has arrived, the call's first delta (id, name) is
sent and the model's own text of the arguments object follows as it arrives, up to its closing brace
(strings and nesting are tracked, so `}` or `</tool_call>` inside a JSON string is argument text).
The final arguments are that same raw text, so streamed fragments always join to them.

Choices where the model strays (vLLM's behaviour where it has one):
- A body in another shape (keys in another order, arguments given as a JSON string) is held until
  `</tool_call>` (or the end of output) and parsed whole; a valid call is sent in one delta with
  arguments `json.dumps(arguments, ensure_ascii=False)`. A body that is no call (bad JSON, no name,
  arguments no object) is returned as content, tags included, as vLLM returns unparseable output
  as content. So is a body cut before its header completed (nothing of it was sent as a call).
- Output cut inside the arguments: the call keeps the text
  streamed so far (it cannot be unsent, as in vLLM's streaming), which is then no complete JSON;
  finish_reason "length" tells the client. A `<` outside a JSON string ends the arguments early.
- Text after the arguments object and before `</tool_call>` is the call's framing and is dropped.
"""
from __future__ import annotations

import json
import re

from services.frontend.parsers.call_blocks import CallBlockParser
from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.json_calls import parse_call
from services.frontend.parsers.json_scan import JsonScan

__all__ = ["HermesToolParser"]

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_HEADER_, _ARGUMENTS, _TAIL = 0, 1, 2


class HermesToolParser(CallBlockParser):
    """`<tool_call>` JSON blocks to tool calls, arguments streamed as the model writes them."""

    __slots__ = ("_phase", "_scan")

    def __init__(self) -> None:
        super().__init__()
        self._begin()

    def _begin(self) -> None:
        self._phase = _HEADER_
        self._scan = JsonScan()

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        if self._phase == _HEADER_:
            header = _HEADER.match(self._buf)
            if header is None:
                return self._whole(out, final=final)
            self._open_call(out, json.loads(header.group(1)))
            self._buf = self._buf[header.end():]
            self._phase = _ARGUMENTS
        if self._phase == _ARGUMENTS:
            done = self._scan_arguments(out)
            if not done and not final:
                return False
            self._phase = _TAIL
        return self._end_at(out, final=final)

    def _scan_arguments(self, out: ParsedDelta) -> bool:
        """Stream the arguments text in `_buf` up to the close of the object; True once closed."""
        buf, scan = self._buf, self._scan
        end = scan.scan(buf, stop_at_lt=True)
        self._calls.add(out, buf[:end])
        self._buf = buf[end:]
        return scan.closed or scan.stopped

    def _whole(self, out: ParsedDelta, *, final: bool) -> bool:
        """A body not in the streamable shape: parse it once it is closed (or the output ended)."""
        buf = self._buf
        end = buf.find(self.END)
        if end < 0 and not final:
            return False
        body = buf if end < 0 else buf[:end]
        self._buf = "" if end < 0 else buf[end + len(self.END):]
        call = parse_call(body, parameters=False)
        if call is None:
            out.content += self.START + body + (self.END if end >= 0 else "")
        else:
            self._open_call(out, *call)
        return True
