"""Token strings as vLLM's logprobs show them: each id decoded alone (special tokens shown), and a token
that ends inside a UTF-8 character re-read with the tokens before it, as vLLM's LogprobsProcessor
corrects it. Their JSON forms are cached per id. One per tokenizer, shared by an API server's requests.
"""
from __future__ import annotations

import json
import weakref
from collections.abc import Sequence

import msgspec
from tokenizers import Tokenizer

from services.frontend.text.detokenizer import token_pieces

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4  # vLLM's: enough for any UTF-8 character split into single-byte tokens
# Ids this far past the tokenizer's vocabulary, or further, are not cached (here or in the logprobs
# formatter's tables): their strings are made at each use. A model's rows past its tokenizer's (padding)
# end well before; an engine that sends such ids must not grow a per-process cache with each.
PAST_VOCABULARY = 1 << 16
_json = msgspec.json.Encoder()


def json_string(text: str) -> str:
    return _json.encode(text).decode()


class TokenStrings:
    """`alone(id)`: the string vLLM's convert_ids_list_to_tokens gives the id; `corrected(id, context)`:
    vLLM's correction of one that ends in U+FFFD, with `context` the sequence's previous token ids."""

    __slots__ = ("__weakref__", "_added", "_alone", "_json", "_marker", "_pieces", "_tokenizer",
                 "cache_limit", "vocab_size")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        table = token_pieces(tokenizer)
        self._pieces: list[bytes | None] | None = None
        self._added: dict[int, tuple[str, bool]] = {}
        if table is not None:
            self._pieces, self._added = table
        self._marker = None if table is not None else _leading_space_marker(tokenizer)
        self._alone: dict[int, str] = {}
        self._json: dict[int, str] = {}
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # Ids at or past this are not cached, here or in the logprobs formatter's tables.
        self.cache_limit = self.vocab_size + PAST_VOCABULARY

    def decode(self, ids: Sequence[int]) -> str:
        """Ids decoded together, special tokens shown (as HF's decode without skip_special_tokens)."""
        pieces = self._pieces
        if pieces is None:
            return self._tokenizer.decode(list(ids), skip_special_tokens=False)
        out: list[str] = []
        run: list[bytes] = []
        size = len(pieces)
        for tid in ids:
            piece = pieces[tid] if 0 <= tid < size else b""
            if piece is None:  # an added token: its content, verbatim, closing the bytes before it
                if run:
                    out.append(b"".join(run).decode("utf-8", "replace"))
                    run = []
                out.append(self._added[tid][0])
            else:
                run.append(piece)
        if run:
            out.append(b"".join(run).decode("utf-8", "replace"))
        return "".join(out)

    def alone(self, tid: int) -> str:
        text = self._alone.get(tid)
        if text is None:
            text = self.decode([tid])
            if self._marker is not None:
                text = _restore_leading_spaces(self._tokenizer.id_to_token(tid) or "", text, self._marker)
            if tid < self.cache_limit:
                self._alone[tid] = text
        return text

    def first_prompt_token(self, tid: int) -> str:
        """The prompt's first token, which vLLM decodes plainly (no leading-space restoring)."""
        return self.decode([tid])

    def corrected(self, tid: int, context: Sequence[int]) -> str:
        """vLLM's LogprobsProcessor._correct_decoded_token: the text `tid` completes after the last
        tokens of `context` that ended inside a character, or "" while the character is incomplete."""
        for n in range(1, min(len(context), CONTEXT_TOKENS) + 1):
            ctx = list(context[-n:])
            full = self.decode([*ctx, tid])
            if full.endswith(REPLACEMENT):
                continue
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if not self.alone(ctx[j]).endswith(REPLACEMENT):
                    break
                clean_end = j
            prefix = self.decode(ctx[:clean_end]) if clean_end else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""

    def json(self, tid: int) -> str:
        """alone(tid) as a JSON string."""
        text = self._json.get(tid)
        if text is None:
            text = json_string(self.alone(tid))
            if tid < self.cache_limit:
                self._json[tid] = text
        return text


def _leading_space_marker(tokenizer: Tokenizer) -> str | None:
    """The Metaspace replacement character whose leading instance decode() strips (vLLM's
    get_leading_space_marker); None for other pre-tokenizers."""
    pre = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    for sub in [pre, *pre.get("pretokenizers", [])]:
        if sub.get("type") == "Metaspace":
            return str(sub.get("replacement", "\u2581"))
    return None


def _restore_leading_spaces(raw: str, text: str, marker: str) -> str:
    markers = len(raw) - len(raw.lstrip(marker))
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


_STRINGS: weakref.WeakKeyDictionary[Tokenizer, TokenStrings] = weakref.WeakKeyDictionary()


def token_strings(tokenizer: Tokenizer) -> TokenStrings:
    """The process's TokenStrings of `tokenizer` (its caches fill as ids are seen)."""
    strings = _STRINGS.get(tokenizer)
    if strings is None:
        strings = _STRINGS[tokenizer] = TokenStrings(tokenizer)
    return strings
