"""gpt-oss output (the harmony format), read token by token with openai-harmony's StreamableParser:
the `openai` tool-call and reasoning parsers. Runs in frontend API-server processes.

Harmony's markers (<|channel|>, <|message|>, <|end|>, <|call|>, ...) are special tokens, so this
parser reads the engine's token ids rather than detokenized text, and the harmony encoding decodes
the messages (it is the gpt-oss tokenizer: `tokenizer_problem` is checked at start-up). The prompt
ends with `<|start|>assistant`, so the output begins with a header. Each message, by its header:

- channel `analysis`: reasoning.
- recipient `functions.NAME`: a tool call when the request is read for calls (tool_choice "auto"
  with --tool-call-parser openai). Its first delta goes out when the header ends; every token of the
  message after that is an argument fragment. Read without calls, its text is content.
- any other recipient (a built-in tool such as `browser` or `python`, which this server does not
  run): reasoning, as the model's own working.
- channel `final`, `commentary` with no recipient (a preamble), or none: content.

Output the format does not allow (text with no header, a token harmony does not expect where it
stands) ends the reading: the rest, decoded without its special tokens, is content at the end.
Output cut inside a header loses that header (none of its message had been sent); cut inside a
message, what was sent stands: a call keeps the arguments written so far, as the text-based parsers'
calls do.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from openai_harmony import (
    HarmonyEncoding,
    HarmonyEncodingName,
    HarmonyError,
    Role,
    StreamableParser,
    StreamState,
    load_harmony_encoding,
)

from services.frontend.parsers.delta import CallLog, ParsedDelta, ToolCall, make_call_id

__all__ = ["HarmonyParser", "encoding", "tokenizer_problem"]

FUNCTIONS = "functions."
# The markers whose ids the served tokenizer must share with the harmony encoding.
MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")

_CONTENT, _REASONING, _CALL = 0, 1, 2


@functools.cache
def encoding() -> HarmonyEncoding:
    """The gpt-oss encoding, loaded once per process (its vocabulary ships inside the package)."""
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def tokenizer_problem(token_to_id: Callable[[str], int | None]) -> str | None:
    """Why a tokenizer cannot be read as harmony (a marker missing or at another id), or None."""
    enc = encoding()
    for marker in MARKERS:
        expected = enc.encode(marker, allowed_special="all")
        got = token_to_id(marker)
        if [got] != expected:
            return (f"the model's tokenizer is not gpt-oss's: {marker} is token {got} there, "
                    f"{expected[0]} in the harmony encoding")
    return None


class HarmonyParser:
    """One request's output as harmony messages; `calls`: read tool calls (else their text is content)."""

    __slots__ = ("_calls", "_enc", "_header", "_kind", "_log", "_parser", "_raw")

    def __init__(self, *, calls: bool) -> None:
        self._enc = encoding()
        self._parser = StreamableParser(self._enc, role=Role.ASSISTANT)
        self._calls = calls
        self._log = CallLog()
        self._kind = _CONTENT  # of the message being read
        self._header: list[int] = []  # ids of the header being read
        self._raw: list[int] | None = None  # once the output broke the format: every id from there

    def push_tokens(self, ids: Sequence[int]) -> ParsedDelta:
        out = ParsedDelta()
        parser, raw = self._parser, self._raw
        for tid in ids:
            if raw is not None:
                raw.append(tid)
                continue
            before = parser.state
            try:
                parser.process(tid)
            except HarmonyError:
                raw = self._raw = [*self._header, tid]
                continue
            state = parser.state
            if state == StreamState.CONTENT:
                if before != StreamState.CONTENT:
                    self._header = []
                    self._begin(out)
                delta = parser.last_content_delta
                if delta:
                    self._add(out, delta)
            elif state == StreamState.HEADER:
                self._header.append(tid)
            else:
                self._header = []
        return out

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        enc = self._enc
        left = self._raw
        if left is None and self._header and not any(enc.is_special_token(t) for t in self._header):
            left = self._header  # no header at all: the model wrote plain text
        if left:
            out.content = enc.decode([t for t in left if not enc.is_special_token(t)])
        self._header, self._raw = [], None
        return out

    def calls(self) -> list[ToolCall]:
        return self._log.complete()

    def _begin(self, out: ParsedDelta) -> None:
        """A message's header ended: what its text is, and a call's first delta."""
        parser = self._parser
        recipient = parser.current_recipient
        if recipient:
            if recipient.startswith(FUNCTIONS) and self._calls:
                self._kind = _CALL
                self._log.open(out, make_call_id(), recipient[len(FUNCTIONS):])
            else:
                self._kind = _CONTENT if recipient.startswith(FUNCTIONS) else _REASONING
        else:
            self._kind = _REASONING if parser.current_channel == "analysis" else _CONTENT

    def _add(self, out: ParsedDelta, text: str) -> None:
        kind = self._kind
        if kind == _CONTENT:
            out.content += text
        elif kind == _REASONING:
            out.reasoning += text
        else:
            self._log.add(out, text)
