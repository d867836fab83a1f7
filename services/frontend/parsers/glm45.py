"""The `glm45` tool-call and reasoning parsers (GLM-4.5, GLM-4.6; GLM-4.7's calls too). Runs in
frontend API-server processes.

Calls: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>` (GLM-4.7
writes no newline after NAME). The arguments are the JSON object
`json.dumps({K: value, ...}, ensure_ascii=False)`, built as the pairs arrive; the call is sent
whole, in one delta, at its `</tool_call>`. Keys and values are stripped, as in vLLM. A value is typed by its
parameter's schema as in qwen3_coder (a string type keeps the text; integer, number, boolean, null
and JSON types take the value when the text is one); a parameter the tools do not describe takes
the text as JSON when it parses, else the text (vLLM also tries Python literals).

Where the model strays: a block whose name is empty, or cut before the name's line ended, is
returned as content, tags included. A value runs to its `</arg_value>` (so it may hold
`</tool_call>`). A call the output ends inside of (cut by max_tokens, or a stop string; its
`</tool_call>` missing) is never sent: its block is content, as the model wrote it (vLLM sends it
without the value that was cut). Anything else in a block after its pairs is framing and is dropped.

Reasoning: `[<think>]reasoning</think>content`. vLLM's glm45 starts in reasoning unless
thinking is switched off; here the output starts in reasoning unless the rendered prompt ends with a
closed `<think></think>` (the template's enable_thinking=false), when it is all content. Without
`</think>`, all of the output is reasoning, up to a `<tool_call>`: a call ends the reasoning and
the content begins at it, as in vLLM (GLM may call a tool without thinking first; the call is not
hidden in the reasoning).
"""
from __future__ import annotations

from services.frontend.parsers.call_blocks import CallBlockParser, KeyValueBlockParser
from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.schema_types import STRING_TYPES, json_or_text, schema_type, typed_value
from services.frontend.parsers.tags import held_suffix
from services.frontend.parsers.think import ThinkParser, prompt_closes_think

__all__ = ["Glm45ToolParser", "glm45"]

KEY = "<arg_key>"
KEY_END = "</arg_key>"
VALUE = "<arg_value>"
VALUE_END = "</arg_value>"
_NAME, _PAIRS, _VALUE, _TAIL = 0, 1, 2, 3


class Glm45ToolParser(KeyValueBlockParser):
    """`<tool_call>NAME` blocks of key/value pairs to tool calls; one fragment per pair."""

    __slots__ = ("_phase", "_search", "_streaming")

    def _begin(self) -> None:
        super()._begin()
        self._phase = _NAME
        self._streaming = False
        self._search = 0

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        if self._phase == _NAME and not self._name(out, final=final):
            return self._phase == _TAIL
        while self._phase in (_PAIRS, _VALUE):
            moved = self._pairs(out, final=final) if self._phase == _PAIRS else self._value(out, final=final)
            if not moved:
                return False
        return self._end_at(out, final=final)

    def _name(self, out: ParsedDelta, *, final: bool) -> bool:
        """Open the call once its name is known; False while it is not (or the block was no call)."""
        buf = self._buf.lstrip()
        found = [at for tag in ("\n", KEY, self.END) if (at := buf.find(tag)) >= 0]
        if not found:
            if not final:
                return False
            return self._not_a_call(out, final=True)
        at = min(found)
        name = buf[:at].strip()
        if not name:
            return self._not_a_call(out, final=final)
        self._open_object(out, name)
        self._buf = buf[at + 1:] if buf[at] == "\n" else buf[at:]
        self._phase = _PAIRS
        return True

    def _pairs(self, out: ParsedDelta, *, final: bool) -> bool:
        """Between pairs: begin the next value, or send `}` when the pairs are over; False while
        that cannot be told yet."""
        head = self._buf.lstrip()
        self._buf = head
        if head.startswith(KEY):
            start = _value_start(head, final=final)
            if start is None:
                return False
            key, at = start
            self._buf = head[at:]
            if key is not None:
                self._begin_value(key)
                return True
        elif not final and any(tag.startswith(head) and tag != head for tag in (KEY, self.END)):
            return False
        self._close_object(out, complete=head.startswith(self.END) or not final)
        self._phase = _TAIL
        return True

    def _begin_value(self, key: str) -> None:
        self._key, self._phase = key, _VALUE
        schema = self._properties.get(key)
        kind, nullable = schema_type(schema)
        self._streaming = schema is not None and kind in STRING_TYPES and not nullable  # "null" may be null
        self._opened = False
        self._search = 0  # where in `_buf` a `</arg_value>` can begin

    def _value(self, out: ParsedDelta, *, final: bool) -> bool:
        """Send the open value once its `</arg_value>` (or the end of output) arrives; a string
        streams. False while it is open."""
        if self._streaming:
            return self._stream(out, final=final)
        buf = self._buf
        end = buf.find(VALUE_END, self._search)
        if end < 0:
            if not final:
                self._search = max(0, len(buf) - len(VALUE_END) + 1)  # each character looked at once
                return False
            end = len(buf) - held_suffix(buf, (VALUE_END,))
            self._buf = ""
        else:
            self._buf = buf[end + len(VALUE_END):]
        self._add_pair(out, buf[:end].strip())
        self._phase = _PAIRS
        return True

    def _stream(self, out: ParsedDelta, *, final: bool) -> bool:
        """A string value: send what arrived, but not leading whitespace, nor trailing whitespace
        or what could begin `</arg_value>` (they may be the value's end)."""
        buf = self._buf
        if not self._opened:
            buf = self._buf = buf.lstrip()
            if not buf and not final:
                return False
        end = buf.find(VALUE_END)
        if end >= 0 or final:
            stop = end if end >= 0 else len(buf) - held_suffix(buf, (VALUE_END,))
            self._send_string(out, buf[:stop].rstrip(), close=True)
            self._buf = buf[stop + len(VALUE_END):] if end >= 0 else ""
            self._phase = _PAIRS
            return True
        piece = buf[:len(buf) - held_suffix(buf, (VALUE_END,))].rstrip()
        if piece:
            self._send_string(out, piece, close=False)
            self._buf = buf[len(piece):]
        return False

    def _add_pair(self, out: ParsedDelta, text: str) -> None:
        schema = self._properties.get(self._key)
        self._send_value(out, json_or_text(text) if schema is None else typed_value(text, schema))

    def _not_a_call(self, out: ParsedDelta, *, final: bool) -> bool:
        """The block is returned as content once it ends (then the phase is _TAIL); False."""
        if self._block_as_content(out, final=final):
            self._phase = _TAIL
        return False


def _value_start(head: str, *, final: bool) -> tuple[str | None, int] | None:
    """(key, where its value begins) of the pair `head` begins with; key None (and where the pair's
    text ends) for a pair that is none (cut in its key, no `<arg_value>` after it); None while more
    text is needed."""
    key_end = head.find(KEY_END)
    if key_end < 0:
        return (None, len(head)) if final else None
    key = head[len(KEY):key_end].strip()
    rest = key_end + len(KEY_END)
    while rest < len(head) and head[rest].isspace():
        rest += 1
    if head.startswith(VALUE, rest):
        return key, rest + len(VALUE)
    if not final and VALUE.startswith(head[rest:]):
        return None
    return None, rest  # no value: what follows is framing


def glm45(prompt: str = "") -> ThinkParser:
    return ThinkParser(starts_in_reasoning=not prompt_closes_think(prompt), content_starts=(CallBlockParser.START,))
