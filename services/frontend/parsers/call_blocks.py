"""The frame shared by tool parsers whose calls sit in <tool_call>...</tool_call> blocks: text outside
the blocks is content, a subclass parses each block's body; and the part shared by the XML-style
formats, whose arguments are key/value pairs typed by the tools' schemas. Runs in frontend API-server
processes."""
from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id
from services.frontend.parsers.schema_types import parameter_schemas
from services.frontend.parsers.tags import BufferedParser, held_suffix

__all__ = ["CallBlockParser", "KeyValueBlockParser"]


class CallBlockParser(BufferedParser):
    """Content until a `<tool_call>`; then the subclass's `_body` consumes the block.

    Text before the first block is content, verbatim. Whitespace right after a call (the newline
    between parallel calls, the one before the end of output) is dropped, as vLLM drops everything
    after the first block; any other text after a call is content, so no text is lost.
    """

    START = "<tool_call>"
    END = "</tool_call>"

    __slots__ = ("_after", "_calls", "_calls_before", "_inside", "_raw")

    def __init__(self) -> None:
        super().__init__()
        self._raw: list[str] = []  # the open block's text from its <tool_call> on, as it arrived
        self._inside = False
        self._after = False  # a call just ended: drop the whitespace that follows it
        self._calls = CallLog()
        self._calls_before = 0  # calls made before the open block

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def push(self, text: str) -> ParsedDelta:
        if self._inside:
            self._raw.append(text)
        return super().push(text)

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        while True:
            if self._inside:
                if not self._body(out, final=final):
                    return False
                self._block_over(out)
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
                self._raw = [self.START, self._buf]
                self._inside = True
                self._calls_before = len(self._calls)
                self._begin()
                continue
            cut = len(buf) - (0 if final else held_suffix(buf, (self.START,)))
            out.content += buf[:cut]
            self._buf = buf[cut:]
            return False

    def _block_over(self, out: ParsedDelta) -> None:
        """The open block is over (`_body` returned True)."""

    @abstractmethod
    def _begin(self) -> None:
        """A block opened: reset the body's state (`_buf` holds the text after `<tool_call>`)."""

    @abstractmethod
    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        """Consume the block's body from `_buf`; True once the block is over (always when `final`),
        with `_buf` left at the text after it."""

    def _open_call(self, out: ParsedDelta, name: str, arguments: str = "") -> None:
        self._calls.open(out, make_call_id(), name, arguments)

    def _block_as_content(self, out: ParsedDelta, *, final: bool) -> bool:
        """A block that is no call is returned as content, tags included, once it ends (or at
        flush); False while it has not."""
        buf = self._buf
        end = buf.find(self.END)
        if end < 0 and not final:
            return False
        body = buf if end < 0 else buf[:end + len(self.END)]
        self._buf = "" if end < 0 else buf[end + len(self.END):]
        out.content += self.START + body
        return True

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


class KeyValueBlockParser(CallBlockParser):
    """Blocks whose arguments are key/value pairs: the JSON object `{"K": value, ...}`, built as `{`,
    then one `"K": value` per pair (`, ` between), then `}`, and sent whole, in one delta, once the
    model closed the call (`_close_object` with `complete`). A call the output ends inside of is never
    sent: its block's text is content, as the model wrote it. A subclass reads the pairs and types each
    value by its parameter's schema in the request's tools."""

    __slots__ = ("_count", "_key", "_opened", "_properties", "_schemas")

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self._calls = CallLog(held=True)
        self._schemas = parameter_schemas(tools or [])
        self._properties: dict[str, Any] = {}  # the open call's parameter schemas
        self._begin()

    def _begin(self) -> None:
        self._count = 0  # pairs sent (or begun) in the open call
        self._key = ""  # the open pair's key
        self._opened = False  # the open string value's opening quote was sent

    def _open_object(self, out: ParsedDelta, name: str) -> None:
        self._properties = self._schemas.get(name, {})
        self._open_call(out, name, "{")

    def _close_object(self, out: ParsedDelta, *, complete: bool) -> None:
        """The call's pairs are over: send it when the model closed it (else `_block_over` returns
        its text as content)."""
        self._calls.add(out, "}")
        if complete:
            self._calls.release(out)

    def _block_over(self, out: ParsedDelta) -> None:
        if self._calls.pending:
            self._calls.drop()
            raw = "".join(self._raw)  # from the block's start to the end of what arrived; `_buf` is what
            out.content += raw[:len(raw) - len(self._buf)]  # follows the block

    def _send_string(self, out: ParsedDelta, piece: str, *, close: bool) -> None:
        """Stream a piece of the open pair's string value (its key and quote first)."""
        head = ""
        if not self._opened:
            head = f'{", " if self._count else ""}{json.dumps(self._key, ensure_ascii=False)}: "'
            self._opened = True
            self._count += 1
        # JSON escapes character by character, so escaped pieces join to the escaped whole.
        self._calls.add(out, head + json.dumps(piece, ensure_ascii=False)[1:-1] + ('"' if close else ""))

    def _send_value(self, out: ParsedDelta, value: Any) -> None:
        """Send the open pair whole."""
        sep = ", " if self._count else ""
        self._count += 1
        key = json.dumps(self._key, ensure_ascii=False)
        self._calls.add(out, f"{sep}{key}: {json.dumps(value, ensure_ascii=False)}")
