"""The frame shared by tool parsers whose calls sit in <tool_call>...</tool_call> blocks: text outside
the blocks is content, a subclass parses each block's body. Runs in frontend API-server processes."""
from __future__ import annotations

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id
from services.frontend.parsers.tags import BufferedParser, held_suffix

__all__ = ["CallBlockParser"]


class CallBlockParser(BufferedParser):
    """Content until a `<tool_call>`; then the subclass's `_body` consumes the block.

    Text before the first block is content, verbatim. Whitespace right after a call (the newline
    between parallel calls, the one before the end of output) is dropped, as vLLM drops everything
    after the first block; any other text after a call is content, so no text is lost.
    """

    START = "<tool_call>"
    END = "</tool_call>"

    __slots__ = ("_after", "_calls", "_calls_before", "_inside")

    def __init__(self) -> None:
        super().__init__()
        self._inside = False
        self._after = False  # a call just ended: drop the whitespace that follows it
        self._calls = CallLog()
        self._calls_before = 0  # calls made before the open block

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        while True:
            if self._inside:
                if not self._body(out, final=final):
                    return False
                self._inside = False
                self._after = len(self._calls) > self._calls_before
                continue
            buf = self._buf
            if self._after:
                buf = buf.lstrip()
                if not buf:
                    self._buf = ""
                    return False
                self._after = False
            start = buf.find(self.START)
            if start >= 0:
                out.content += buf[:start]
                self._buf = buf[start + len(self.START):]
                self._inside = True
                self._calls_before = len(self._calls)
                self._begin()
                continue
            cut = len(buf) - (0 if final else held_suffix(buf, (self.START,)))
            out.content += buf[:cut]
            self._buf = buf[cut:]
            return False

    def _begin(self) -> None:
        """A block opened: reset the body's state (`_buf` holds the text after `<tool_call>`)."""
        raise NotImplementedError

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        """Consume the block's body from `_buf`; True once the block is over (always when `final`),
        with `_buf` left at the text after it."""
        raise NotImplementedError

    def _open_call(self, out: ParsedDelta, name: str, arguments: str = "") -> None:
        self._calls.open(out, make_call_id(), name, arguments)

    def _end_at(self, out: ParsedDelta, *, final: bool) -> bool:
        """After a call's own text: skip to the end of the block (what is left of the body is the
        call's framing, as vLLM ignores it). A new `<tool_call>` also ends it."""
        buf = self._buf
        end, start = buf.find(self.END), buf.find(self.START)
        if start >= 0 and (end < 0 or start < end):
            self._buf = buf[start:]
            return True
        if end >= 0:
            self._buf = buf[end + len(self.END):]
            return True
        if final:
            self._buf = ""
            return True
        self._buf = buf[len(buf) - held_suffix(buf, (self.END, self.START)):]
        return False
