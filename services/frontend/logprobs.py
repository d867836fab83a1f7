"""A request's logprobs for its response: the packed arrays of its engine outputs (protocol/logprobs.py)
turned into OpenAI's JSON, one pre-rendered fragment per token, so the writers only join them. Runs in
each API server process, one LogprobsFormatter per request that asked for logprobs.

Chat entries are `{"token", "logprob", "bytes", "top_logprobs": [the k most likely, in rank order]}`;
completions rows are (token, its logprob, {token: logprob} of it and the k most likely, text_offset),
joined into OpenAI's columns. Token strings are TokenStrings' (each id decoded alone, as vLLM), or
"token_id:N" with return_tokens_as_token_ids; logprobs below -9999 (or -inf) are -9999.0, as vLLM.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protocol.logprobs import Segment
from services.frontend.token_strings import CONTEXT_TOKENS, REPLACEMENT, TokenStrings, bytes_json
from services.frontend.token_strings import json_string as _enc

FLOOR = -9999.0
Entry = Any  # chat: the entry's JSON text; completions: (token JSON, logprob, top dict JSON, offset)


class LogprobsFormatter:
    """`sampled(segment)` gives the entries of generated tokens, `prompt(segments, ids)` those of the
    prompt (completions' echo), `render(entries)` the JSON object a response carries as `logprobs`."""

    __slots__ = ("_as_ids", "_chat", "_context", "_heads", "_offset", "_strings", "_tails", "top")

    def __init__(self, strings: TokenStrings, *, chat: bool, top: int, as_token_ids: bool = False) -> None:
        self._strings = strings
        self._chat = chat
        self.top = top  # alternatives shown per token
        self._as_ids = as_token_ids
        self._context: list[int] = []  # the last generated ids (vLLM's correction context)
        self._offset = 0  # completions' text_offset of the next token
        # Per id, a chat entry's text before and after its logprob: '{"token":..,"logprob":' and
        # ',"bytes":[..]'; "" for an id whose string depends on the tokens before it.
        self._heads: dict[int, str] = {}
        self._tails: dict[int, str] = {}

    # ---- entries ----

    def sampled(self, seg: Segment) -> list[Entry]:
        """One entry per generated token of `seg`, in order."""
        return self._rows(seg, 0, seg.positions, self._context)

    def prompt(self, segments: Sequence[Segment], prompt_ids: Sequence[int]) -> list[Entry]:
        """A completion's echoed prompt: its first token (no logprob), then one entry per prompt row."""
        assert not self._chat, "chat has no echo here"
        first = prompt_ids[0]
        token = self._token_id(first) if self._as_ids else self._strings.first_prompt_token(first)
        entries: list[Entry] = [(_enc(token), "null", "null", str(self._offset))]
        self._offset += len(token)
        context: list[int] = []  # vLLM's prompt context starts at its second token
        for seg in segments:
            entries += self._rows(seg, 0, seg.positions, context)
        return entries

    def _rows(self, seg: Segment, start: int, end: int, context: list[int]) -> list[Entry]:
        ids, lps, w = seg.token_ids, seg.logprobs, seg.k + 1
        top = min(self.top, seg.k)
        heads, tails = self._heads, self._tails
        out: list[Entry] = []
        for i in range(start, end):
            row = i * w
            own = ids[row]
            if self._chat:
                tops = []
                for j in range(row + 1, row + 1 + top):
                    tid = ids[j]
                    head = heads.get(tid)
                    if not head:
                        head, tail = self._fragments(tid, context)
                    else:
                        tail = tails[tid]
                    lp = lps[j]
                    tops.append(head + repr(lp if lp > FLOOR else FLOOR) + tail + "}")
                head = heads.get(own)
                if not head:
                    head, tail = self._fragments(own, context)
                else:
                    tail = tails[own]
                lp = lps[row]
                out.append(head + repr(lp if lp > FLOOR else FLOOR) + tail + ',"top_logprobs":['
                           + ",".join(tops) + "]}")
            else:
                out.append(self._completion_row(seg, row, top, context))
            if self._strings.alone(own).endswith(REPLACEMENT):
                context.append(own)
                del context[:-CONTEXT_TOKENS]
            elif context:
                context.clear()  # only the tokens after the last whole character matter
        return out

    def _completion_row(self, seg: Segment, row: int, top: int, context: list[int]) -> Entry:
        ids, lps = seg.token_ids, seg.logprobs
        own = ids[row]
        token = self._text(own, context)
        lp = lps[row]
        own_lp = repr(lp if lp > FLOOR else FLOOR)
        # vLLM's dict: the token first, then the k most likely (the token once, at its first place).
        keys, values = [_enc(token)], [own_lp]
        for j in range(row + 1, row + 1 + top):
            tid = ids[j]
            if tid != own:
                lp = lps[j]
                keys.append(_enc(self._text(tid, context)))
                values.append(repr(lp if lp > FLOOR else FLOOR))
        if len(set(keys)) < len(keys):  # two ids with one string: one key, its last value (a dict's)
            merged = dict(zip(keys, values, strict=True))
            keys, values = list(merged), list(merged.values())
        offset = self._offset
        self._offset += len(token)
        return (keys[0], own_lp, "{" + ",".join(k + ":" + v for k, v in zip(keys, values, strict=True)) + "}",
                str(offset))

    def _text(self, tid: int, context: Sequence[int]) -> str:
        if self._as_ids:
            return self._token_id(tid)
        text = self._strings.alone(tid)
        return self._strings.corrected(tid, context) if text.endswith(REPLACEMENT) else text

    def _fragments(self, tid: int, context: Sequence[int]) -> tuple[str, str]:
        """A chat entry's text around its logprob; cached unless the string depends on `context`."""
        strings = self._strings
        text = strings.alone(tid)
        if text.endswith(REPLACEMENT):
            text = strings.corrected(tid, context)
            return '{"token":' + _enc(self._token_id(tid) if self._as_ids else text) + ',"logprob":', \
                   ',"bytes":' + bytes_json(text)
        head = '{"token":' + (_enc(self._token_id(tid)) if self._as_ids else strings.json(tid)) + ',"logprob":'
        tail = ',"bytes":' + strings.bytes_json(tid)
        self._heads[tid], self._tails[tid] = head, tail
        return head, tail

    @staticmethod
    def _token_id(tid: int) -> str:
        return "token_id:" + str(tid)

    # ---- JSON ----

    def render(self, entries: Sequence[Entry]) -> str:
        """The `logprobs` object of a choice (or a chunk's choice) holding these entries."""
        if self._chat:
            return '{"content":[' + ",".join(entries) + "]}"
        return ('{"text_offset":[' + ",".join(e[3] for e in entries) + '],"token_logprobs":['
                + ",".join(e[1] for e in entries) + '],"tokens":[' + ",".join(e[0] for e in entries)
                + '],"top_logprobs":[' + ",".join(e[2] for e in entries) + "]}")

    def prompt_logprobs(self, segments: Sequence[Segment], positions: int) -> str:
        """vLLM's `prompt_logprobs`: null for the first token, then per position {id: {logprob, rank,
        decoded_token}} of the prompt's token and the k most likely; `positions` the prompt's length."""
        out = ["null"]
        context: list[int] = []
        strings = self._strings
        for seg in segments:
            ids, lps, ranks, w = seg.token_ids, seg.logprobs, seg.ranks, seg.k + 1
            for i in range(seg.positions):
                row = i * w
                own = ids[row]
                items: dict[int, tuple[float, int]] = {own: (lps[row], ranks[i])}
                for j in range(1, w):
                    items[ids[row + j]] = (lps[row + j], j)  # the token again: the same logprob, rank j
                cells = []
                for tid, (lp, rank) in items.items():
                    text = strings.alone(tid)
                    if text.endswith(REPLACEMENT):
                        text = strings.corrected(tid, context)
                    cells.append('"' + str(tid) + '":{"logprob":' + repr(lp if lp > FLOOR else FLOOR) + ',"rank":'
                                 + str(rank) + ',"decoded_token":' + _enc(text) + "}")
                out.append("{" + ",".join(cells) + "}")
                if strings.alone(own).endswith(REPLACEMENT):
                    context.append(own)
                    del context[:-CONTEXT_TOKENS]
                elif context:
                    context.clear()
        out += ["null"] * (positions - len(out))  # rows an engine did not send (none should be missing)
        return "[" + ",".join(out) + "]"

