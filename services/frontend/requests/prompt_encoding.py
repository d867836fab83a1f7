"""Texts and text pairs tokenized as vLLM tokenizes a pooling prompt: with `truncate_prompt_tokens`
alone the tokenizer itself truncates (special tokens kept, a pair cut longest first, as transformers'
`truncation=True` does), with `truncation_side` too the whole prompt is sliced from that side (vLLM
turns the tokenizer's truncation off then). Runs in each API server process, from the translators;
`encode_batch` lets go of the GIL, so a route may call it from a thread for a large body."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

from services.frontend.errors import APIError

_CHARS_PER_TOKEN: weakref.WeakKeyDictionary[Tokenizer, int] = weakref.WeakKeyDictionary()


def max_chars_per_token(tokenizer: Tokenizer) -> int:
    """vLLM's bound on the characters one token covers: its longest vocabulary entry (computed once a
    tokenizer)."""
    found = _CHARS_PER_TOKEN.get(tokenizer)
    if found is None:
        found = _CHARS_PER_TOKEN[tokenizer] = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1)
    return found


def bounded(tokenizer: Tokenizer, texts: Sequence[str], names: Sequence[str], *, max_model_len: int,
            keep: int | None, side: str | None) -> list[str]:
    """vLLM's `_text_len_check`, before any tokenizing: a text longer than max_model_len times the
    longest token cannot fit the context, so without truncate_prompt_tokens it is refused (naming the
    input) and with it pre-cut to that many characters from the cut side. vLLM pre-cuts only when
    truncation_side is set too; this server also cuts from the right without it (the tokenizer keeps the
    first tokens then), so that no request tokenizes megabytes it will throw away."""
    limit = max_model_len * max_chars_per_token(tokenizer)
    out = list(texts)
    for i, text in enumerate(out):
        if len(text) <= limit:
            continue
        if keep is None:
            raise APIError(400, f"{names[i]}: This model's maximum context length is {max_model_len} tokens. "
                           f"However, your prompt contains {len(text)} characters (more than {limit} characters, "
                           f"which is the upper bound for {max_model_len} input tokens). Please reduce the length "
                           "of the input prompt.", param=names[i])
        out[i] = text[-limit:] if side == "left" else text[:limit]
    return out


@dataclass(frozen=True, slots=True)
class Encoded:
    """A prompt's token ids and, for a pair read with token types, the index of the first token of
    type 1 (vLLM's compressed_token_type_ids: the length when there is none)."""

    ids: list[int]
    token_type_split: int | None = None


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], *, add_special_tokens: bool, keep: int | None,
                 side: str | None) -> list[Encoded]:
    """Each text's token ids, cut to `keep` tokens when it has more."""
    special = _special(tokenizer, pair=False) if add_special_tokens else 0
    out = []
    for text, whole in zip(texts, tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens),
                           strict=True):
        if keep is None or len(whole.ids) <= keep:
            out.append(Encoded(whole.ids))
        elif side is not None or keep < special:
            # Below the special tokens, transformers leaves the text whole (it logs an error) and vLLM's
            # renderer then slices it from the right, special tokens and all.
            out.append(Encoded(sliced(whole.ids, keep, side or "right")))
        else:
            bare = tokenizer.encode(text, add_special_tokens=False)
            bare.truncate(keep - special, direction="right")
            out.append(Encoded(tokenizer.post_process(bare, None, add_special_tokens=add_special_tokens).ids))
    return out


def encode_pairs(tokenizer: Tokenizer, firsts: Sequence[str], seconds: Sequence[str], *, keep: int | None,
                 side: str | None, token_types: bool, use_sep_token: bool, only_second: bool = False,
                 max_model_len: int | None = None, first_name: str = "queries") -> list[Encoded]:
    """Each (query, document) pair as a cross-encoder reads it: the tokenizer's pair encoding
    ([CLS] a [SEP] b [SEP] for BERT), or, without separators, the two texts joined as one. One query
    (`firsts` of one text) pairs with every document; else the sides pair up one to one.
    Each text is tokenized once and the pair put together by the tokenizer's post-processor (what its
    pair encoding does), so one query is not tokenized again for every document; a query that alone
    leaves no room in `max_model_len` is refused before any document is tokenized.
    `only_second`: the tokenizer cuts the document alone to fit `keep` (vLLM's way once a request sets
    max_tokens_per_doc), not the longer text first."""
    queries = list(firsts) * len(seconds) if len(firsts) == 1 else list(firsts)
    if not use_sep_token:
        joined = encode_texts(tokenizer, [a + b for a, b in zip(queries, seconds, strict=True)],
                              add_special_tokens=True, keep=keep, side=side)
        return [Encoded(e.ids, len(e.ids) if token_types else None) for e in joined]
    special = _special(tokenizer, pair=True)
    query_encs = tokenizer.encode_batch(list(firsts), add_special_tokens=False)
    if keep is None and max_model_len is not None:
        for i, enc in enumerate(query_encs):
            if len(enc.ids) + special > max_model_len:  # every pair would be past the context
                name = f"{first_name}[{i}]" if len(firsts) > 1 else first_name
                raise APIError(400, f"{name}: This model's maximum context length is {max_model_len} tokens. "
                               f"However, this query alone contains {len(enc.ids)} input tokens, which leaves no "
                               "room for a document. Please reduce the length of the query, or set "
                               "truncate_prompt_tokens.", param=name)
    doc_encs = tokenizer.encode_batch(list(seconds), add_special_tokens=False)
    if len(firsts) == 1:
        query_encs = query_encs * len(seconds)
    out = []
    for q, d in zip(query_encs, doc_encs, strict=True):
        whole = tokenizer.post_process(q, d, add_special_tokens=True)
        ids, types = whole.ids, whole.type_ids
        if keep is not None and len(ids) > keep:
            if side is not None or keep < special:  # as for one text (encode_texts)
                ids, types = sliced(ids, keep, side or "right"), sliced(types, keep, side or "right")
            else:
                enc = (_second_cut if only_second else _longest_first)(tokenizer, _copy(q), _copy(d), keep)
                ids, types = enc.ids, enc.type_ids
        out.append(Encoded(ids, _first_one(types) if token_types else None))
    return out


def sliced(ids: list[int], keep: int, side: str) -> list[int]:
    """The last `keep` ("left": the start is cut) or the first (`right`)."""
    return ids[len(ids) - keep:] if side == "left" else ids[:keep]


def _copy(enc: Encoding) -> Encoding:
    """A copy to truncate (truncating works in place; one query's encoding serves every pair)."""
    return Encoding.merge([enc], growing_offsets=False)


def _longest_first(tokenizer: Tokenizer, first: Encoding, second: Encoding, keep: int) -> Encoding:
    """The pair cut to `keep` tokens as the tokenizers library's LongestFirst strategy cuts it: the
    longer text down towards the shorter one first, then both evenly (the longer keeps the odd token).
    `first` and `second`: the texts' encodings without special tokens, cut here in place."""
    room = keep - _special(tokenizer, pair=True)
    short, long = sorted((len(first.ids), len(second.ids)))
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short, long = room // 2, room // 2 + room % 2
    n1, n2 = (short, long) if len(first.ids) <= len(second.ids) else (long, short)
    first.truncate(n1, direction="right")
    second.truncate(n2, direction="right")
    return tokenizer.post_process(first, second, add_special_tokens=True)


def _second_cut(tokenizer: Tokenizer, first: Encoding, second: Encoding, keep: int) -> Encoding:
    """The pair cut to `keep` tokens by cutting the document only (tokenizers' OnlySecond)."""
    room = keep - _special(tokenizer, pair=True) - len(first.ids)
    if room < 0:
        raise APIError(400, f"truncate_prompt_tokens={keep}: the query alone is longer, and with "
                       "max_tokens_per_doc only the document is cut", param="truncate_prompt_tokens")
    second.truncate(room, direction="right")
    return tokenizer.post_process(first, second, add_special_tokens=True)


def cut_text(tokenizer: Tokenizer, text: str, max_tokens: int) -> str:
    """The text cut at a token boundary so that it tokenizes (without special tokens) to at most
    `max_tokens` tokens, as vLLM applies max_tokens_per_query and max_tokens_per_doc: cut where the
    last kept token ends, and again while re-tokenizing the cut text still gives more."""
    while text:
        enc = tokenizer.encode(text, add_special_tokens=False)
        if len(enc.ids) <= max_tokens:
            break
        end = min(enc.offsets[max_tokens - 1][1], enc.offsets[max_tokens][0]) if max_tokens > 0 else 0
        text = text[:min(end, len(text) - 1)]
    return text


def _special(tokenizer: Tokenizer, *, pair: bool) -> int:
    processor = tokenizer.post_processor
    return processor.num_special_tokens_to_add(pair) if processor is not None else 0


def _first_one(type_ids: list[int]) -> int:
    """vLLM's compress_token_type_ids: where type 1 starts, the length when it never does."""
    try:
        return type_ids.index(1)
    except ValueError:
        return len(type_ids)
