"""A request's logprobs for its response: the packed arrays of its engine outputs (protocol/logprobs.py)
turned into OpenAI's JSON, one pre-rendered fragment per token, so the writers only join them. Runs in
each API server process, one LogprobsFormatter per request that asked for logprobs.

Chat entries are `{"token", "logprob", "bytes", "top_logprobs": [the k most likely, in rank order]}`,
kept as UTF-8 from the per-id fragments to the chunk (one non-ASCII token in a str join makes the whole
join wide, and its encode slow); completions rows are (token, its logprob, {token: logprob} of it and
the k most likely, text_offset), joined into OpenAI's columns. Token strings are TokenStrings' (each id
decoded alone, as vLLM), or "token_id:N" with return_tokens_as_token_ids; logprobs below -9999 (or -inf)
are -9999.0, as vLLM.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import msgspec

from protocol.logprobs import Segment
from services.frontend.text.token_strings import CONTEXT_TOKENS, REPLACEMENT, TokenStrings
from services.frontend.text.token_strings import json_string as _enc

FLOOR = -9999.0
_encode = msgspec.json.Encoder().encode


def _number(lp: float) -> str:
    """A logprob as JSON, floored, written as vLLM's pydantic writes it (shortest round-trip digits,
    exponents as `e-7`; Python's repr would write `e-07`)."""
    return _encode(lp if lp > FLOOR else FLOOR).decode()


def _byte_numbers(lps: Sequence[float]) -> list[bytes]:
    """_number of each as UTF-8, in one encoder call (a segment's logprobs, every row's)."""
    values = lps if type(lps) is tuple else list(lps)  # msgspec would write a memoryview as base64
    text = _encode(values)
    if values and (not min(values) > FLOOR or b"n" in text):  # below the floor, -inf or NaN (null)
        text = _encode([lp if lp > FLOOR else FLOOR for lp in values])
    return text[1:-1].split(b",")


_CHAT_OPEN, _CHAT_CLOSE = b'{"content":[', b"]}"  # a chat choice's logprobs object around its entries
Entry = Any  # chat: the entry's JSON; completions: (token JSON, logprob, top dict JSON, offset); all UTF-8
# (token-out: its JSON text)
_TEMPLATES: dict[int, bytes] = {}  # per count of alternatives, a chat entry's JSON around its 3 * (1 + top) parts


def _template(top: int) -> bytes:
    """The `%` template of a chat entry with `top` alternatives: the token's head, logprob and tail, then
    each alternative's, which make the entry in one C call."""
    template = _TEMPLATES.get(top)
    if template is None:
        template = b'%b%b%b,"top_logprobs":[' + b",".join([b"%b%b%b}"] * top) + b"]}"
        if len(_TEMPLATES) < 64:  # top is bounded by --max-logprobs; a bound all the same
            _TEMPLATES[top] = template
    return template


class _Table:
    """Per token id, what does not change for a tokenizer (each id is decoded alone, as vLLM does): a
    chat entry's head and tail, its JSON before and after its logprob as UTF-8 (`{"token":..,"logprob":`
    and `,"bytes":[..]`; _template closes it as the token's or an alternative's), and a completions key
    (`"token":`) with its string's length. None until first made, and for an id whose string depends
    on the tokens before it. An id whose text alone ends inside a character is in `partial`: its cell
    and key are those it has with no tokens before it ("", vLLM's correction finding no context),
    read only then. Each list is made on its first miss.
    Lists, not dicts: a lookup in a cache that grows to the vocabulary misses the CPU cache, and a
    list's touches less memory than a dict's."""

    __slots__ = ("heads", "keys", "lengths", "limit", "partial", "size", "tails")

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        # Ids at or past this are not kept: made at each use (an engine's id of 2**31 - 1 would otherwise
        # make each list that long). TokenStrings.cache_limit: a model's padded rows end well before it.
        self.limit = limit
        # Each list made at its first use (a chat request's or a completion's), the vocabulary long.
        self.heads: list[bytes | None] = []
        self.tails: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.lengths: list[int] = []
        self.partial: set[int] = set()

    def cell_room(self, tid: int) -> bool:
        """`heads` and `tails` the vocabulary long, or past it for `tid` (a model's padded rows); False
        (nothing made) for a `tid` at or past `limit`."""
        if tid >= len(self.heads):
            if tid >= self.limit:
                return False
            more = max(tid + 1, self.size) - len(self.heads)
            self.heads += [None] * more
            self.tails += [None] * more
        return True

    def key_room(self, tid: int) -> bool:
        """`keys` and `lengths` the vocabulary long, or past it for `tid`; False at or past `limit`."""
        if tid >= len(self.keys):
            if tid >= self.limit:
                return False
            more = max(tid + 1, self.size) - len(self.keys)
            self.keys += [None] * more
            self.lengths += [0] * more
        return True


# One table per TokenStrings (so per tokenizer) and token form (its string, or "token_id:N").
_TABLES: weakref.WeakKeyDictionary[TokenStrings, tuple[_Table | None, _Table | None]] = weakref.WeakKeyDictionary()


def _table(strings: TokenStrings, as_token_ids: bool) -> _Table:
    pair = _TABLES.get(strings, (None, None))
    table = pair[as_token_ids]
    if table is None:
        table = _Table(strings.vocab_size, strings.cache_limit)
        _TABLES[strings] = (pair[0], table) if as_token_ids else (table, pair[1])
    return table


class LogprobsFormatter:
    """`sampled(segment)` gives the entries of generated tokens, `prompt(segments, ids)` those of the
    prompt (completions' echo), `render(entries)` the JSON object a response carries as `logprobs`."""

    __slots__ = ("_as_ids", "_chat", "_context", "_offset", "_strings", "_table", "_template", "_token_out", "top")

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
        self._table = _table(strings, as_token_ids)
        self._template = _template(top)  # a chat entry's, with all `top` alternatives

    def native_cells(self) -> tuple[list[bytes | None], list[bytes | None], set[int]] | None:
        """What the C step (generation/_plainc.c) makes a chat entry from, as _chat_one does: the table's
        heads and tails (the lists themselves: grown in place, never replaced) and its ids that end inside a
        character; None for completions' rows and token-out entries, which it does not make."""
        if not self._chat or self._token_out:
            return None
        table = self._table
        return table.heads, table.tails, table.partial

    def context_free(self) -> bool:
        """No generated token before the next ends inside a character (vLLM's correction context empty):
        the next entry depends on nothing before it."""
        return not self._context

    # ---- entries ----

    def sampled(self, seg: Segment) -> list[Entry]:
        """One entry per generated token of `seg`, in order."""
        if self._token_out:
            return [self._token_row(seg, i) for i in range(seg.positions)]
        if self._chat:
            if seg.positions == 1 and seg.k == self.top and not self._context:
                entry = self._chat_one(seg.token_ids, seg.logprobs)
                if entry is not None:
                    return [entry]
            return self._chat_rows(seg, self._context)
        return self._completion_rows(seg, self._context)

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
        entries: list[Entry] = [(_encode(token), b"null", b"null", b"%d" % self._offset)]
        self._offset += len(token)
        context: list[int] = []  # vLLM's prompt context starts at its second token
        for seg in segments:
            entries += self._completion_rows(seg, context)
        return entries

    def _chat_one(self, ids: Sequence[int], lps: Sequence[float]) -> Entry | None:
        """The entry of a generated token's row (one an output, nearly every call) with every alternative
        shown and no token before it ending inside a character; None, for _chat_rows, when it has a
        fragment not made yet or a logprob to floor."""
        if type(lps) is not tuple:
            return None  # a view, which msgspec would write as base64
        text = _encode(lps)
        if not min(lps) > FLOOR or b"n" in text:
            return None  # below the floor, -inf or NaN (null)
        table = self._table
        heads, tails = table.heads, table.tails
        nums = text[1:-1].split(b",")
        parts: list[bytes | None] = []
        try:
            for tid, num in zip(ids, nums):  # noqa: B905 (one length by make; a keyword costs)
                parts += (heads[tid], num, tails[tid])
        except IndexError:  # past the lists: made below
            parts = [None]
        if None in parts:  # an id seen for the first time: its fragments made (as with nothing before it)
            for tid in ids:
                self._cell(tid)
            parts = []
            try:
                for tid, num in zip(ids, nums):  # noqa: B905
                    parts += (heads[tid], num, tails[tid])
            except IndexError:  # an id past the tables' limit (not kept): _chat_rows' slow row
                return None
        if ids[0] in table.partial:  # the next token's string depends on this one
            self._context.append(ids[0])
        return self._template % tuple(parts)

    def _chat_rows(self, seg: Segment, context: list[int]) -> list[Entry]:
        """Each row's entry made by its template from its ids' cached heads and tails and its logprobs'
        JSON, when no tokens before it end inside a character (nearly always). Any other row, or one
        with a fragment not made yet (a None, which `%b` refuses), takes _chat_row."""
        ids, w = seg.token_ids, seg.k + 1
        top = min(self.top, seg.k)
        nums = _byte_numbers(seg.logprobs)
        template = _template(top)
        table = self._table
        heads, tails = table.heads, table.tails
        out: list[Entry] = []
        for row in range(0, seg.positions * w, w):
            if not context:
                end = row + 1 + top
                parts: list[bytes | None] = []
                try:
                    for tid, num in zip(ids[row:end], nums[row:end], strict=True):
                        parts += (heads[tid], num, tails[tid])
                    out.append(template % tuple(parts))
                except (TypeError, IndexError):
                    pass
                else:
                    if ids[row] in table.partial:  # the next token's string depends on this one
                        context.append(ids[row])
                    continue
            out.append(self._chat_row(ids, nums, row, top, context))
        return out

    def _chat_row(self, ids: Sequence[int], nums: Sequence[bytes], row: int, top: int, context: list[int]) -> Entry:
        own = self._cell(ids[row])
        head, tail = own or self._cell_in(ids[row], context)
        parts = [head, nums[row], tail]
        for j in range(row + 1, row + 1 + top):
            head, tail = self._cell(ids[j]) or self._cell_in(ids[j], context)
            parts += (head, nums[j], tail)
        _advance(context, ids[row], own is not None)
        return _template(top) % tuple(parts)

    def _cell(self, tid: int) -> tuple[bytes, bytes] | None:
        """`tid`'s chat head and tail (see _Table), made on first use; None when its string depends on
        context."""
        table = self._table
        if not table.cell_room(tid):  # far past the vocabulary: made for this use only
            text = self._strings.alone(tid)
            return None if text.endswith(REPLACEMENT) else _cell(self._token_id(tid) if self._as_ids else text, text)
        if table.heads[tid] is None:
            text = self._strings.alone(tid)
            if text.endswith(REPLACEMENT):
                table.partial.add(tid)
                text = ""  # with no tokens before it
            table.heads[tid], table.tails[tid] = _cell(self._token_id(tid) if self._as_ids else text, text)
        if tid in table.partial:
            return None
        return table.heads[tid], table.tails[tid]  # type: ignore[return-value]

    def _cell_in(self, tid: int, context: Sequence[int]) -> tuple[bytes, bytes]:
        """The chat head and tail of a token whose string depends on `context`."""
        text = self._strings.corrected(tid, context)
        return _cell(self._token_id(tid) if self._as_ids else text, text)

    def _completion_rows(self, seg: Segment, context: list[int]) -> list[Entry]:
        """A row's columns from its ids' cached keys, when no tokens before it end inside a character;
        any other row, or one with a key not made yet, takes _completion_row."""
        ids, w = seg.token_ids, seg.k + 1
        if type(ids) is not tuple:
            ids = list(ids)
        top = min(self.top, seg.k)
        nums = _byte_numbers(seg.logprobs)
        table = self._table
        key, lengths, partial = table.keys.__getitem__, table.lengths, table.partial
        out: list[Entry] = []
        for row in range(0, seg.positions * w, w):
            end = row + 1 + top
            if not context:
                try:
                    keys = list(map(key, ids[row:end]))
                except IndexError:
                    keys = [None]
                if None not in keys:
                    own = ids[row]
                    values = nums[row:end]
                    if own in ids[row + 1:end]:  # vLLM's dict: the token once, at its first place
                        for j in range(len(keys) - 1, 0, -1):
                            if ids[row + j] == own:
                                del keys[j], values[j]
                    out.append(self._columns(keys, values, lengths[own]))
                    if own in partial:
                        context.append(own)
                    continue
            out.append(self._completion_row(ids[row:end], nums[row:end], context))
        return out

    def _columns(self, keys: list[Any], values: list[bytes], length: int) -> Entry:
        """A completions row: (token, its logprob, the top dict's JSON, text_offset); `keys` the dict's
        keys (`"token":`), the token's first, `values` their logprobs' JSON, `length` the token's."""
        if len(set(keys)) < len(keys):  # two ids with one string: one key, its last value (a dict's)
            merged = dict(zip(keys, values, strict=True))
            pairs = b",".join(map(bytes.__add__, merged, merged.values()))
        else:
            pairs = b",".join(map(bytes.__add__, keys, values))
        offset = self._offset
        self._offset += length
        return keys[0][:-1], values[0], b"{" + pairs + b"}", b"%d" % offset

    def _completion_row(self, ids: Sequence[int], nums: Sequence[bytes], context: list[int]) -> Entry:
        own = ids[0]
        key, length = self._key(own, context)
        # vLLM's dict: the token first, then the k most likely (the token once, at its first place).
        keys, values = [key + b":"], [nums[0]]
        for j in range(1, len(ids)):
            tid = ids[j]
            if tid != own:
                keys.append(self._key(tid, context)[0] + b":")
                values.append(nums[j])
        entry = self._columns(keys, values, length)
        _advance(context, own, not self._strings.alone(own).endswith(REPLACEMENT))
        return entry

    def _key(self, tid: int, context: Sequence[int]) -> tuple[bytes, int]:
        """A completions token: its JSON string (UTF-8) and the length of the string (for text_offset), with
        `context` before it; the table keeps it as it is with no context (see _Table)."""
        table = self._table
        partial = self._strings.alone(tid).endswith(REPLACEMENT)
        if partial:
            table.partial.add(tid)
        if self._as_ids:
            name = self._token_id(tid)
            key, length = found = _encode(name), len(name)
        else:
            text = "" if partial else self._strings.alone(tid)
            key, length = _encode(text), len(text)
            if partial and context:
                text = self._strings.corrected(tid, context)
                found = _encode(text), len(text)
            else:
                found = key, length
        if table.key_room(tid):
            table.keys[tid], table.lengths[tid] = key + b":", length
        return found

    @staticmethod
    def _token_id(tid: int) -> str:
        return "token_id:" + str(tid)

    # ---- JSON ----

    def render_frame(self) -> tuple[bytes, bytes] | None:
        """What render() puts before and after its entries (commas between) where it does only that (chat
        entries, not token-out's); None for the others."""
        return (_CHAT_OPEN, _CHAT_CLOSE) if self._chat and not self._token_out else None

    def render(self, entries: Sequence[Entry]) -> bytes:
        """The `logprobs` object of a choice (or a chunk's choice) holding these entries, as UTF-8."""
        if self._token_out:
            return ('{"content":[' + ",".join(entries) + "]}").encode()
        if self._chat:
            return b"".join((_CHAT_OPEN, b",".join(entries), _CHAT_CLOSE))
        return b"".join((b'{"text_offset":[', b",".join([e[3] for e in entries]), b'],"token_logprobs":[',
                         b",".join([e[1] for e in entries]), b'],"tokens":[', b",".join([e[0] for e in entries]),
                         b'],"top_logprobs":[', b",".join([e[2] for e in entries]), b"]}"))

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


def _cell(token: str, text: str) -> tuple[bytes, bytes]:
    """A chat entry's head and tail (see _Table) of a token shown as `token` whose text is `text`."""
    return b'{"token":' + _encode(token) + b',"logprob":', b',"bytes":' + _encode(list(text.encode("utf-8", "replace")))


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
