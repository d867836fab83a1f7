"""The `qwen3_coder` tool-call parser (Qwen3-Coder, Qwen3.5): XML-style calls,
`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`,
whose values are typed by the request's tool schemas. Runs in frontend API-server processes.

The arguments are the JSON object `json.dumps({P: value, ...}, ensure_ascii=False)`, built as the
values arrive; the call is sent whole, in one delta, once the model closed it (`</function>`, or
`</tool_call>` without it).
A value loses one newline at each end; it is typed by the parameter's schema as vLLM does: a string
type (or no schema) keeps the text; "null"/"None" is null for a nullable or non-string type;
integer and number types take the number when the text is one; boolean takes true/false in any
case; object, array and other types take the text as JSON when it parses. Anything else stays the
string the model wrote (vLLM also tries Python literals; here the value must be JSON).

A `</parameter>` ends a value only when `<parameter=`, `</function>`, `</tool_call>` or the end of
output follows it (whitespace aside), so a value may contain the tag (code that mentions it).
Where the model strays: a block that does not begin with `<function=NAME>` is returned as
content, tags included, at its `</tool_call>` (or at flush). A call the output ends inside of (cut
by max_tokens, or a stop string) is never sent: its block is content, as the model wrote it (vLLM
sends it without the value that was cut).
"""
from __future__ import annotations

from services.frontend.parsers.call_blocks import KeyValueBlockParser
from services.frontend.parsers.delta import ParsedDelta
from services.frontend.parsers.schema_types import STRING_TYPES, schema_type, typed_value
from services.frontend.parsers.tags import held_suffix

__all__ = ["Qwen3CoderToolParser", "SeedOssToolParser"]

FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
_FUNC, _PARAMS, _VALUE, _TAIL = 0, 1, 2, 3


class Qwen3CoderToolParser(KeyValueBlockParser):
    """`<function=NAME>` blocks to tool calls; one argument fragment per parameter."""

    __slots__ = ("_emitted", "_phase", "_search", "_streaming")

    def _begin(self) -> None:
        super()._begin()
        self._phase = _FUNC
        self._streaming = False
        self._emitted = 0  # characters of the open string value sent
        self._search = 0

    def _body(self, out: ParsedDelta, *, final: bool) -> bool:
        while True:
            if self._phase == _FUNC:
                head = self._buf.lstrip()
                if head.startswith(FUNCTION) and (gt := head.find(">")) >= 0:
                    name = head[len(FUNCTION):gt]
                    self._open_object(out, name)
                    self._buf = head[gt + 1:]
                    self._phase = _PARAMS
                elif not final and (FUNCTION.startswith(head) or head.startswith(FUNCTION)):
                    return False
                else:
                    return self._block_as_content(out, final=final)
            elif self._phase == _PARAMS:
                head = self._buf.lstrip()
                if head.startswith(PARAMETER) and (gt := head.find(">")) >= 0:
                    self._begin_value(head[len(PARAMETER):gt])
                    self._buf = head[gt + 1:]
                elif not final and any(tag.startswith(head) for tag in (PARAMETER, FUNCTION_END)) \
                        or head.startswith(PARAMETER) and not final:
                    self._buf = head
                    return False
                else:  # </function>, or the model went on without closing it (or the output ended)
                    self._buf = head[len(FUNCTION_END):] if head.startswith(FUNCTION_END) else head
                    self._close_object(out, complete=head.startswith((FUNCTION_END, self.END)))
                    self._phase = _TAIL
            elif self._phase == _VALUE:
                end, sure = self._value_end(final=final)
                if end is None:
                    if self._streaming:
                        self._stream_value(out, sure)
                    return False
                value, self._buf = self._buf[:end], self._buf[end + len(PARAMETER_END):]
                self._add_parameter(out, value)
                self._phase = _PARAMS
            else:
                return self._end_at(out, final=final)

    def _value_end(self, *, final: bool) -> tuple[int | None, int]:
        """(where the open value's real `</parameter>` is, or None while that cannot be told yet;
        how much of `_buf` is value text for sure)."""
        buf = self._buf
        while (end := buf.find(PARAMETER_END, self._search)) >= 0:
            after = end + len(PARAMETER_END)
            while after < len(buf) and buf[after].isspace():
                after += 1
            after_value = (PARAMETER, FUNCTION_END, self.END)
            if buf.startswith(after_value, after):
                return end, end
            longest = max(map(len, after_value))
            rest = buf[after:after + longest]
            if len(rest) < longest and any(tag.startswith(rest) for tag in after_value):
                return (end if final else None), end  # what follows could still make it the end
            self._search = end + 1  # text inside the value: never looked at again
        cut = len(buf) - held_suffix(buf, (PARAMETER_END,))
        if not final:
            return None, cut
        self._buf = buf[:cut] + PARAMETER_END  # the value runs to the end of output
        return cut, cut

    def _begin_value(self, name: str) -> None:
        self._key, self._phase = name, _VALUE
        kind, nullable = schema_type(self._properties.get(name))
        self._streaming = kind in STRING_TYPES and not nullable  # a nullable one may be "null"
        self._opened, self._emitted = False, 0
        self._search = 0  # where in `_buf` a `</parameter>` that may end the value can begin

    def _stream_value(self, out: ParsedDelta, sure: int) -> None:
        """Send what is surely string text: not the first newline, nor a newline that may be the last."""
        buf = self._buf
        if not buf:
            return  # the first character tells whether a newline is to be dropped
        start = 1 if buf.startswith("\n") else 0
        if sure > start and buf[sure - 1] == "\n":
            sure -= 1
        if sure - start > self._emitted:
            self._send_string(out, buf[start + self._emitted:sure], close=False)
            self._emitted = sure - start

    def _add_parameter(self, out: ParsedDelta, text: str) -> None:
        if text.startswith("\n"):
            text = text[1:]
        if text.endswith("\n"):
            text = text[:-1]
        if self._streaming:
            self._send_string(out, text[self._emitted:], close=True)
            return
        self._send_value(out, typed_value(text, self._properties.get(self._key)))


class SeedOssToolParser(Qwen3CoderToolParser):
    """`seed_oss` (ByteDance Seed-OSS): qwen3_coder's grammar in `<seed:tool_call>` blocks, as vLLM reads it."""

    START = "<seed:tool_call>"
    END = "</seed:tool_call>"

    __slots__ = ()
