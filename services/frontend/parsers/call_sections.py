"""The frame shared by tool parsers whose calls sit in a section of special tokens (DeepSeek-V3,
Kimi-K2): `SECTION_BEGIN (CALL_BEGIN header HEADER_END arguments CALL_END)* SECTION_END`, text
outside the section is content. Runs in frontend API-server processes.

A subclass gives the tokens and reads a call's header into its name (and id). A call is sent whole,
in one delta, once its arguments are complete: the model's own text of the JSON object after the
header, up to the bracket that closes it (strings and nesting tracked); what follows it up to
CALL_END is framing and is dropped. No arguments at all are `{}`.

Choices where the model strays: text before the section is content verbatim; whitespace inside the
section is dropped, and so is any other text there between calls (as vLLM drops it: it sits among
control tokens); after SECTION_END, whitespace aside, the output is content again and a later
section is parsed too. A call that is not complete is dropped, never sent: its header incomplete at
its CALL_END (or at the end of output) or unreadable, its arguments no JSON object, or left open by
a `<` outside a string (every token begins with one) or by the end of the output (cut by
max_tokens: finish_reason "length" tells the client). Its text is the model's control tokens, not
content. A call whose CALL_END is missing ends at the next CALL_BEGIN or SECTION_END.
"""
from __future__ import annotations

from abc import abstractmethod

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall
from services.frontend.parsers.json_scan import JsonScan, strict_json
from services.frontend.parsers.tags import BufferedParser, held_suffix

__all__ = ["CallSectionParser"]

_TEXT, _SECTION, _HEADER, _ARGUMENTS, _JSON, _RAW, _FRAMING, _AFTER = range(8)


class CallSectionParser(BufferedParser):
    """Calls in a section of special tokens; a subclass sets the tokens and reads headers."""

    SECTION_BEGIN: tuple[str, ...] = ()
    SECTION_END: tuple[str, ...] = ()
    CALL_BEGIN = ""
    CALL_END = ""
    HEADER_END = ""
    ARGUMENTS_PREFIX = ""  # dropped before the arguments when present (DeepSeek-V3's "```json")
    ARGUMENTS_SUFFIX = ""  # dropped after raw arguments when present (its closing "```")

    __slots__ = ("_arguments_text", "_calls", "_pending", "_prefixed", "_scan", "_state")

    def __init__(self) -> None:
        super().__init__()
        self._state = _TEXT
        self._scan = JsonScan()
        self._prefixed = False  # ARGUMENTS_PREFIX was looked for
        self._calls = CallLog()
        self._pending: tuple[str, str] | None = None  # (call id, name) of the call being read
        self._arguments_text: list[str] = []  # its arguments so far

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    @abstractmethod
    def _header(self, header: str) -> tuple[str, str] | None:
        """(name, call id) from the text between CALL_BEGIN and HEADER_END; None if it is no header."""

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        """Advance one state; False when more text is needed (or, at flush, all is done)."""
        state = self._state
        if state == _TEXT:
            return self._text(out, final=final)
        if state == _SECTION:
            return self._section(final=final)
        if state == _AFTER:  # the whitespace after a section is dropped
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = _TEXT
            return True
        if state == _HEADER:
            return self._read_header(out, final=final)
        if state == _ARGUMENTS:
            return self._arguments(final=final)
        if state == _JSON:
            end = self._scan.scan(self._buf, stop_at_lt=True)
            self._arguments_text.append(self._buf[:end])
            self._buf = self._buf[end:]
            if self._scan.closed or self._scan.stopped:
                self._send("".join(self._arguments_text) if self._scan.closed else "", out)
                self._state = _FRAMING
                return True
            if final:
                self._buf = ""
            return False
        if state == _RAW:
            return self._raw(out, final=final)
        return self._framing(final=final)

    def _arguments(self, *, final: bool) -> bool:
        """Before the arguments: drop whitespace (and ARGUMENTS_PREFIX), then tell JSON from raw text."""
        head = self._buf.lstrip()
        prefix = "" if self._prefixed else self.ARGUMENTS_PREFIX
        if prefix and head.startswith(prefix):
            self._buf, self._prefixed = head[len(prefix):], True
            return True
        if not final and (not head or prefix.startswith(head)):
            self._buf = head
            return False
        self._buf, self._prefixed = head, True
        if head.startswith(("{", "[")):
            self._state, self._scan = _JSON, JsonScan()
        else:
            self._state = _RAW
        return True

    def _text(self, out: ParsedDelta, *, final: bool) -> bool:
        buf = self._buf
        found = [(at, tag) for tag in self.SECTION_BEGIN if (at := buf.find(tag)) >= 0]
        if found:
            at, tag = min(found)
            out.content += buf[:at]
            self._buf = buf[at + len(tag):]
            self._state = _SECTION
            return True
        cut = len(buf) - (0 if final else held_suffix(buf, self.SECTION_BEGIN))
        out.content += buf[:cut]
        self._buf = buf[cut:]
        return False

    def _section(self, *, final: bool) -> bool:
        """Between calls: the next CALL_BEGIN or the SECTION_END; other text here is dropped."""
        buf = self._buf
        tags = (self.CALL_BEGIN, *self.SECTION_END)
        found = [(at, tag) for tag in tags if (at := buf.find(tag)) >= 0]
        if not found:
            self._buf = "" if final else buf[len(buf) - held_suffix(buf, tags):]
            return False
        at, tag = min(found)
        self._buf = buf[at + len(tag):]
        self._state = _HEADER if tag == self.CALL_BEGIN else _AFTER
        return True

    def _read_header(self, out: ParsedDelta, *, final: bool) -> bool:
        buf = self._buf
        end = buf.find(self.HEADER_END)
        stop = self._call_stop(buf)
        if end < 0 or 0 <= stop < end:  # no header before the call ends: drop the call
            if stop < 0:
                if final:
                    self._buf = ""
                return False
            self._buf = buf[stop:]
            self._state = _FRAMING
            return True
        call = self._header(buf[:end])
        self._buf = buf[end + len(self.HEADER_END):]
        if call is None:
            self._state = _FRAMING
            return True
        name, call_id = call
        self._pending, self._arguments_text = (call_id, name), []
        self._state, self._prefixed = _ARGUMENTS, False
        return True

    def _raw(self, out: ParsedDelta, *, final: bool) -> bool:
        """Arguments that are no JSON value: none at all (in a call that ended) are `{}`, other text
        drops the call."""
        buf = self._buf
        stop = self._call_stop(buf)
        if stop < 0 and not final:
            return False
        text = (buf if stop < 0 else buf[:stop]).strip()
        suffix = self.ARGUMENTS_SUFFIX
        if suffix and text.endswith(suffix):
            text = text[:-len(suffix)].rstrip()
        self._send("{}" if not text and stop >= 0 else "", out)  # no arguments, in a call that ended
        self._buf = "" if stop < 0 else buf[stop:]
        self._state = _FRAMING
        return stop >= 0

    def _send(self, arguments: str, out: ParsedDelta) -> None:
        """Send the call being read when `arguments` are a complete JSON object, else drop it."""
        pending, self._pending = self._pending, None
        try:
            complete = isinstance(strict_json(arguments), dict)
        except ValueError:
            complete = False
        if pending is not None and complete:
            self._calls.open(out, pending[0], pending[1], arguments)

    def _framing(self, *, final: bool) -> bool:
        """After a call's arguments: skip to its CALL_END (or a CALL_BEGIN / SECTION_END that ends it)."""
        buf = self._buf
        stop = self._call_stop(buf)
        if stop < 0:
            self._buf = "" if final else buf[len(buf) - held_suffix(buf, self._stops()):]
            return False
        self._buf = buf[stop + len(self.CALL_END):] if buf.startswith(self.CALL_END, stop) else buf[stop:]
        self._state = _SECTION
        return True

    def _stops(self) -> tuple[str, ...]:
        return (self.CALL_END, self.CALL_BEGIN, *self.SECTION_END)

    def _call_stop(self, buf: str) -> int:
        """Where the open call ends in `buf`: its CALL_END, else the next CALL_BEGIN or SECTION_END; -1."""
        found = [at for tag in self._stops() if (at := buf.find(tag)) >= 0]
        return min(found, default=-1)
