"""Reading an upstream text/event-stream body in the router process, for the codecs that translate
chat chunks: each event's data, as the WHATWG rules define it (lines end in CRLF, LF or CR; `data:`
lines join with LF; a blank line ends an event; comments and other fields are skipped)."""
from __future__ import annotations


class SSEData:
    """Feed body bytes as they arrive; get back the data of every event they complete."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk
        # A CR at the end may be the first half of a CRLF: wait for the next byte to know.
        hold = buffer.endswith(b"\r")
        if hold:
            buffer = buffer[:-1]
        lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buffer = lines.pop() + (b"\r" if hold else b"")
        return self._lines(lines)

    def finish(self) -> list[bytes]:
        """At the end of the body: an unterminated last line and event still count (lenient, so a
        final `data: [DONE]` without its blank line is not lost)."""
        rest = self._buffer.rstrip(b"\r")
        self._buffer = b""
        return self._lines([rest, b""] if rest else [b""])

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data"):
                field, _, value = line.partition(b":")
                if field == b"data":
                    self._data.append(value[1:] if value.startswith(b" ") else value)
            # `event:`, `id:`, `retry:` and `: comment` lines carry nothing the codecs use.
        return events
