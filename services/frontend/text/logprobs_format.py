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

import msgspec

from protocol.logprobs import Segment
from services.frontend.text.token_strings import CONTEXT_TOKENS, REPLACEMENT, TokenStrings, bytes_json
from services.frontend.text.token_strings import json_string as _enc

FLOOR = -9999.0
_encode = msgspec.json.Encoder().encode


def _number(lp: float) -> str:
    """A logprob as JSON, floored, written as vLLM's pydantic writes it (shortest round-trip digits,
    exponents as `e-7`; Python's repr would write `e-07`)."""
    return _encode(lp if lp > FLOOR else FLOOR).decode()


def _numbers(lps: Sequence[float]) -> list[str]:
    """_number of each, in one encoder call (a token's own logprob and its alternatives')."""
    return _encode([lp if lp > FLOOR else FLOOR for lp in lps]).decode()[1:-1].split(",")  # NaN, -inf: FLOOR
Entry = Any  # chat: the entry's JSON text; completions: (token JSON, logprob, top dict JSON, offset)


class LogprobsFormatter:
    """`sampled(segment)` gives the entries of generated tokens, `prompt(segments, ids)` those of the
    prompt (completions' echo), `render(entries)` the JSON object a response carries as `logprobs`."""

    __slots__ = ("_as_ids", "_chat", "_context", "_fragments", "_offset", "_strings", "_token_out", "top")

    def __init__(self, strings: TokenStrings, *, chat: bool, top: int, as_token_ids: bool = False,
                 token_out: bool = False) -> None:
        """`token_out`: /inference/v1/generate's entries, vLLM's token-in shape (ids, no strings)."""
        self._strings = strings
        self._chat = chat
        self._token_out = token_out
        self.top = top  # alternatives shown per token
        self._as_ids = as_token_ids
        self._context: list[int] = []  # the last generated ids (vLLM's correction context)
        self._offset = 0  # completions' text_offset of the next token
        self._fragments = strings.id_fragments if as_token_ids else strings.chat_fragments

    # ---- entries ----

    def sampled(self, seg: Segment) -> list[Entry]:
        """One entry per generated token of `seg`, in order."""
        if self._token_out:
            return [self._token_row(seg, i) for i in range(seg.positions)]
        return self._rows(seg, 0, seg.positions, self._context)

    def _token_row(self, seg: Segment, i: int) -> Entry:
        """vLLM's GenerateLogProbsContent: {"token_id", "logprob", "rank", "top_logprobs"}, the
        alternatives being the first max(k, 1) of vLLM's dict (the token, then the k most likely, the
        token once); a rank of 0 is null, as vLLM sends it."""
        ids, lps, w = seg.token_ids, seg.logprobs, seg.k + 1
        row = i * w
        own = ids[row]
        cells: dict[int, tuple[float, int]] = {own: (lps[row], seg.ranks[i])}
        for j in range(1, w):
            cells[ids[row + j]] = (lps[row + j], j)
        tops = [_token_cell(tid, lp, rank) for tid, (lp, rank) in list(cells.items())[:max(min(self.top, seg.k), 1)]]
        lp, rank = cells[own]
        return _token_cell(own, lp, rank)[:-1] + ',"top_logprobs":[' + ",".join(tops) + "]}"

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
        if not self._chat:
            return [self._completion_row(seg, i * w, top, context) for i in range(start, end)]
        cache, fragments = self._fragments, self._strings.fragments
        size = len(cache)
        out: list[Entry] = []
        for i in range(start, end):
            row = i * w
            own = ids[row]
            frag = (cache[own] if own < size else None) or fragments(own, self._as_ids)
            whole = bool(frag)  # its string does not depend on the tokens before it
            if not whole:
                frag = self._fragments_in(own, context)
            nums = _numbers(lps[row:row + 1 + top])
            parts = [frag[0], nums[0], frag[1], ',"top_logprobs":[']
            for j in range(1, 1 + top):
                tid = ids[row + j]
                alt = ((cache[tid] if tid < size else None) or fragments(tid, self._as_ids)
                       or self._fragments_in(tid, context))
                parts += (alt[0], nums[j], alt[1], "},")
            if top:
                parts[-1] = "}"
            parts.append("]}")
            out.append("".join(parts))
            _advance(context, own, whole)
        return out

    def _completion_row(self, seg: Segment, row: int, top: int, context: list[int]) -> Entry:
        ids, lps = seg.token_ids, seg.logprobs
        own = ids[row]
        key, length = self._key(own, context)
        lp = lps[row]
        own_lp = _number(lp)
        # vLLM's dict: the token first, then the k most likely (the token once, at its first place).
        keys, values = [key], [own_lp]
        for j in range(row + 1, row + 1 + top):
            tid = ids[j]
            if tid != own:
                lp = lps[j]
                keys.append(self._key(tid, context)[0])
                values.append(_number(lp))
        if len(set(keys)) < len(keys):  # two ids with one string: one key, its last value (a dict's)
            merged = dict(zip(keys, values, strict=True))
            keys, values = list(merged), list(merged.values())
        offset = self._offset
        self._offset += length
        _advance(context, own, not self._strings.alone(own).endswith(REPLACEMENT))
        return (key, own_lp, "{" + ",".join(k + ":" + v for k, v in zip(keys, values, strict=True)) + "}",
                str(offset))

    def _key(self, tid: int, context: Sequence[int]) -> tuple[str, int]:
        """A completions token: its JSON string, and the length of the string (for text_offset)."""
        if self._as_ids:
            name = "token_id:" + str(tid)
            return '"' + name + '"', len(name)
        text = self._strings.alone(tid)
        if text.endswith(REPLACEMENT):
            text = self._strings.corrected(tid, context)
            return _enc(text), len(text)
        return self._strings.json(tid), len(text)

    def _fragments_in(self, tid: int, context: Sequence[int]) -> tuple[str, str]:
        """A chat entry's text around its logprob for a token whose string depends on `context`."""
        text = self._strings.corrected(tid, context)
        return ('{"token":' + _enc(self._token_id(tid) if self._as_ids else text) + ',"logprob":',
                ',"bytes":' + bytes_json(text))

    @staticmethod
    def _token_id(tid: int) -> str:
        return "token_id:" + str(tid)

    # ---- JSON ----

    def render(self, entries: Sequence[Entry]) -> str:
        """The `logprobs` object of a choice (or a chunk's choice) holding these entries."""
        if self._chat or self._token_out:
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
                    cells.append('"' + str(tid) + '":{"logprob":' + _number(lp) + ',"rank":'
                                 + str(rank) + ',"decoded_token":' + _enc(text) + "}")
                out.append("{" + ",".join(cells) + "}")
                _advance(context, own, not strings.alone(own).endswith(REPLACEMENT))
        out += ["null"] * (positions - len(out))  # rows an engine did not send (none should be missing)
        return "[" + ",".join(out) + "]"


def _token_cell(tid: int, lp: float, rank: int) -> str:
    return ('{"token_id":' + str(tid) + ',"logprob":' + _number(lp) + ',"rank":'
            + (str(rank) if rank else "null") + "}")


def _advance(context: list[int], own: int, whole: bool) -> None:
    """vLLM's correction context after a position: the trailing tokens that end inside a character
    (only those matter to the next one's string), at most CONTEXT_TOKENS of them."""
    if not whole:
        context.append(own)
        del context[:-CONTEXT_TOKENS]
    elif context:
        context.clear()
