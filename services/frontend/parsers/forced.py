"""Output of a forced tool_choice (frontend API-server processes): the engine's structured output
guarantees its shape, so these parsers only read it. Chosen by tool_choice, not by a flag.

- A named function: the whole output is that function's arguments object. Its first delta carries
  the call's id and name with the first text; every later delta is an argument fragment.
- "required": the output is a JSON array of {"name", "parameters"} objects (the schema
  tools.forced_schema builds; one item at most without parallel_tool_calls), read as it streams. A
  call's first delta (index, id, name) goes out once its name is complete and its parameters have
  begun, as vLLM's does; then the parameters' text as the model writes it, so the fragments join to
  the call's `arguments`, that object's JSON text verbatim (whitespace and escapes kept). Keys in the
  other order: the parameters wait for the name, then go out whole with it. Only the framing is
  read token by token; inside the parameters strings and brackets are tracked, their JSON is the
  engine's to guarantee.
  Text that leaves this shape (no array, an item that is no such call, text after the array) is
  content from there: the whole output as written while no call was sent, else from the start of
  the item not yet sent, or from where a sent call's framing broke. Output cut short by max_tokens
  reads the same, except that a sent call keeps what was streamed (its arguments then no complete
  JSON) and its cut framing is dropped: cut before any call was sent, the output comes back as
  content as it was written, with finish_reason "length" saying why.
"""
from __future__ import annotations

import msgspec

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, ToolCallDelta, make_call_id
from services.frontend.parsers.json_scan import JsonScan
from services.frontend.parsers.tags import BufferedParser

__all__ = ["NamedToolParser", "RequiredToolParser"]

_WHITESPACE = " \t\r\n"  # what JSON allows between tokens
_decode_str = msgspec.json.Decoder(str).decode
# RequiredToolParser's phases, by what it reads next: the framing's tokens, a string, the parameters.
(_ARRAY, _FIRST_ITEM, _ITEM, _KEY, _KEY_STRING, _COLON, _VALUE, _NAME_STRING, _PARAMETERS, _NEXT_KEY, _NEXT_ITEM,
 _AFTER, _CONTENT) = range(13)


class NamedToolParser:
    __slots__ = ("_id", "_name", "_parts")

    def __init__(self, name: str) -> None:
        self._name = name
        self._id = make_call_id()
        self._parts: list[str] = []

    def push(self, text: str) -> ParsedDelta:
        first = not self._parts
        self._parts.append(text)
        if first:
            return ParsedDelta(tool_calls=[ToolCallDelta(0, self._id, self._name, text)])
        return ParsedDelta(tool_calls=[ToolCallDelta(0, None, None, text)])

    def flush(self) -> ParsedDelta:
        return ParsedDelta()

    def calls(self) -> list[ToolCall]:
        return [ToolCall(self._id, self._name, "".join(self._parts))] if self._parts else []


class RequiredToolParser(BufferedParser):
    """tool_choice "required": the calls of a JSON array, streamed as it is read, one phase per
    JSON token the array's framing expects next."""

    __slots__ = ("_arguments", "_calls", "_held", "_key", "_name", "_phase", "_scan", "_scanned", "_sent")

    def __init__(self) -> None:
        super().__init__()
        self._phase = _ARRAY
        self._calls = CallLog()
        # What comes back as content if the shape breaks here: the output so far while no call was
        # sent, the item so far while its call is unsent, None inside a sent call.
        self._held: str | None = ""
        self._scan = JsonScan()
        self._scanned = 0  # how much of the key or name string at the buffer's start was scanned
        self._key = ""  # the item's key whose value comes next
        self._name: str | None = None  # the item's name, once read
        self._arguments: str | None = None  # the item's parameters text, while they wait for its name
        self._sent = False  # the item's call has been opened

    def calls(self) -> list[ToolCall]:
        return self._calls.complete()

    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        phase = self._phase
        if phase == _CONTENT:
            out.content += self._buf
            self._buf = ""
            return False
        if phase == _KEY_STRING or phase == _NAME_STRING:  # left in the buffer until it is read whole
            end = self._scanned = self._scanned + self._scan.scan(self._buf[self._scanned:])
            if not self._scan.closed:
                return self._cut(out) if final else False
            return self._string_read(out, end)
        if phase == _PARAMETERS:
            text = self._take(self._scan.scan(self._buf))
            if self._sent:
                self._calls.add(out, text)
            elif self._name is not None:  # the first of them: the call goes out with its name
                self._open(out, self._name, text)
            else:  # no name yet: held until it comes
                self._arguments = (self._arguments or "") + text
            if not self._scan.closed:
                return self._cut(out) if final else False
            self._phase = _NEXT_KEY
            return True
        buf = self._buf  # every other phase waits for one token of the framing, after whitespace
        head = buf.lstrip(_WHITESPACE)
        self._take(len(buf) - len(head))
        if not head:
            return self._cut(out) if final and phase != _AFTER else False
        if phase == _AFTER:  # text after the array
            self._phase = _CONTENT
            return True
        return self._token(out, head[0])

    def _token(self, out: ParsedDelta, ch: str) -> bool:
        """Take the next token if it is one the phase expects; else the shape broke."""
        phase = self._phase
        if phase == _ARRAY and ch == "[":
            self._phase = _FIRST_ITEM
        elif (phase == _FIRST_ITEM or phase == _ITEM) and ch == "{":
            if self._held is None:
                self._held = ""
            self._name = self._arguments = None
            self._key, self._sent, self._phase = "", False, _KEY
        elif (phase == _FIRST_ITEM or phase == _NEXT_ITEM) and ch == "]":
            self._held, self._phase = None, _AFTER
        elif phase == _KEY and ch == '"':
            self._phase = _KEY_STRING
        elif phase == _COLON and ch == ":":
            self._phase = _VALUE
        elif phase == _VALUE and ch == '"' and self._key == "name":
            self._phase = _NAME_STRING
        elif phase == _VALUE and ch == "{" and self._key == "parameters":
            self._scan, self._phase = JsonScan(), _PARAMETERS
            self._arguments = self._arguments or ""
            return True  # the brace is the parameters' first character
        elif phase == _NEXT_KEY and ch == ",":
            self._phase = _KEY
        elif phase == _NEXT_KEY and ch == "}" and self._sent:  # the call had both its keys
            self._phase = _NEXT_ITEM
        elif phase == _NEXT_ITEM and ch == ",":
            self._phase = _ITEM
        else:
            return self._break(out)
        if ch == '"':
            self._scan, self._scanned = JsonScan(in_string=True), 1
        else:
            self._take(1)
        return True

    def _string_read(self, out: ParsedDelta, end: int) -> bool:
        """A key or the name, the buffer's first `end` characters, is complete: take it if it is one
        the item may have here."""
        try:
            value = _decode_str(self._buf[:end])
        except msgspec.DecodeError:
            return self._break(out)
        if self._phase == _KEY_STRING:
            if not (value == "name" and self._name is None or value == "parameters" and self._arguments is None):
                return self._break(out)  # another key, or one said twice
            self._take(end)
            self._key, self._phase = value, _COLON
            return True
        self._take(end)
        self._name, self._phase = value, _NEXT_KEY
        if self._arguments is not None:  # the parameters came first: they go out whole with the name
            self._open(out, value, self._arguments)
        return True

    def _open(self, out: ParsedDelta, name: str, arguments: str) -> None:
        self._calls.open(out, make_call_id(), name, arguments)
        self._sent, self._held = True, None

    def _take(self, n: int) -> str:
        """The next n characters of the buffer, consumed (and held while they may become content)."""
        text, self._buf = self._buf[:n], self._buf[n:]
        if self._held is not None:
            self._held += text
        return text

    def _break(self, out: ParsedDelta) -> bool:
        """The output left the shape: what was held and the rest are content."""
        out.content += (self._held or "") + self._buf
        self._buf, self._held, self._phase = "", None, _CONTENT
        return False

    def _cut(self, out: ParsedDelta) -> bool:
        """The output ended inside the array: what was held is content; a sent call keeps what was
        streamed, and the framing cut after it is dropped."""
        if self._held is not None:
            out.content += self._held + self._buf
        self._buf, self._held, self._phase = "", None, _CONTENT
        return False
