"""The inputs of a pooling route (/v1/embeddings, /pooling, gRPC's Embed and Classify): OpenAI's `input` in
its four forms made into token-id lists, cut as vLLM's renderer cuts a pooling prompt
(prompt_encoding.py) and checked against the context length, and this server's bound on inputs per call.
Runs in each API server process; tokenizing a batch runs in a thread past THREADED_CHARS (HF tokenizers'
encode_batch lets go of the GIL), so a large body does not stall the other streams."""
from __future__ import annotations

import asyncio
from typing import Any

from tokenizers import Tokenizer

from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.pooling_fields import MAX_INPUTS, check_count, check_length
from services.frontend.requests.prompt_encoding import bounded, encode_texts, sliced

# Below this many characters in all, tokenizing on the event loop costs less than a thread hop.
THREADED_CHARS = 16_384
_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def input_forms(value: str | list[Any], param: str = "input",
                max_inputs: int = MAX_INPUTS) -> list[str] | list[list[int]]:
    """`input` as a list of texts or a list of token-id lists; a 400 naming the field when it is neither,
    empty, or longer than `max_inputs`. Every pooling route parses its input here, so all accept what
    vLLM's pydantic models accept (whole-number floats as token ids among them)."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError(400, f"{param}: must not be empty: send {_FORMS}", param=param)
    first = value[0]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        ids = _ids(value)
        if ids is None:
            raise APIError(400, f"{param}: a list of token ids holds integers only; send {_FORMS}", param=param)
        return [ids]
    check_count(param, len(value), max_inputs)
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise APIError(400, f"{param}[{i}]: expected a string like the other inputs; send {_FORMS}",
                               param=f"{param}[{i}]")
        return value
    out = []
    for i, item in enumerate(value):
        ids = _ids(item) if isinstance(item, list) else None
        if ids is None:
            raise APIError(400, f"{param}[{i}]: expected a list of token ids; send {_FORMS}", param=f"{param}[{i}]")
        out.append(ids)
    return out


def _ids(items: list[Any]) -> list[int] | None:
    """Token ids, whole-number floats made the ids they name (vLLM's list[int] is pydantic's, lax)."""
    if all(type(t) is int for t in items):
        return items
    if all(type(t) is int or type(t) is float and t.is_integer() for t in items):
        return [int(t) for t in items]
    return None


async def token_ids(model: Model, inputs: list[str] | list[list[int]], *, add_special_tokens: bool,
                    keep: int | None, side: str | None, max_model_len: int, param: str = "input") -> list[list[int]]:
    """encode_inputs, in a thread when the texts are long."""
    args = (model.tokenizer, inputs)
    kw: dict[str, Any] = {"add_special_tokens": add_special_tokens, "keep": keep, "side": side,
                          "max_model_len": max_model_len, "param": param}
    if inputs and isinstance(inputs[0], str) and sum(map(len, inputs)) > THREADED_CHARS:
        return await asyncio.to_thread(encode_inputs, *args, **kw)
    return encode_inputs(*args, **kw)


def encode_inputs(tokenizer: Tokenizer, inputs: list[str] | list[list[int]], *, add_special_tokens: bool,
                  keep: int | None, side: str | None, max_model_len: int, param: str = "input") -> list[list[int]]:
    """Each input's token ids: texts bounded in characters (prompt_encoding.bounded), tokenized and cut
    to `keep` tokens as vLLM's renderer cuts them, id lists checked against the vocabulary and sliced
    from `side` (default right); then each checked against the context length. An empty id list is
    refused (nothing to pool)."""
    names = [f"{param}[{i}]" if len(inputs) > 1 else param for i in range(len(inputs))]
    if inputs and isinstance(inputs[0], str):
        texts = bounded(tokenizer, inputs, names, max_model_len=max_model_len, keep=keep,
                        side=side)
        ids = [e.ids for e in encode_texts(tokenizer, texts, add_special_tokens=add_special_tokens, keep=keep,
                                           side=side)]
    else:
        ids = inputs  # type: ignore[assignment]
        in_vocabulary(tokenizer, ids, param)
        if keep is not None:
            ids = [sliced(row, keep, side or "right") if len(row) > keep else row for row in ids]
    for name, row in zip(names, ids, strict=True):
        if not row:
            raise APIError(400, f"{name}: the input has no tokens: nothing to pool", param=name)
        check_length(name, len(row), max_model_len)
    return ids


def in_vocabulary(tokenizer: Tokenizer, ids: list[list[int]], param: str = "input") -> None:
    """A 400 naming the input that holds a token id outside the vocabulary."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    for i, row in enumerate(ids):
        if row and not (0 <= min(row) and max(row) < vocab):
            bad = next(t for t in row if not 0 <= t < vocab)
            name = f"{param}[{i}]" if len(ids) > 1 else param
            raise APIError(400, f"{name}: token id {bad} is out of range [0, {vocab})", param=name)
