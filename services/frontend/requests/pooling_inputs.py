"""The inputs of a pooling route (/v1/embeddings, /pooling): OpenAI's `input` in its four forms made into
token-id lists, with vLLM's truncation and length checks and this server's bound on inputs per call.
Runs in each API server process; tokenizing a batch runs in a thread (HF tokenizers' encode_batch lets go
of the GIL), so a large body does not stall the other streams."""
from __future__ import annotations

import asyncio
from typing import Any

from services.frontend.errors import APIError
from services.frontend.model import Model

# OpenAI's own bound on the inputs of one embeddings call (its API refuses more). vLLM sets none; 10,000
# inputs are 10,000 engine requests queued by one client ahead of everyone else, so this server refuses
# past it, naming the field and the limit (docs/frontend.md).
MAX_INPUTS = 2048
# Below this many characters in all, tokenizing on the event loop costs less than a thread hop.
THREADED_CHARS = 16_384
_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def input_forms(value: str | list[Any], param: str = "input") -> list[str] | list[list[int]]:
    """`input` as a list of texts or a list of token-id lists; a 400 naming the field when it is neither,
    empty, or longer than MAX_INPUTS."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError(400, f"{param}: must not be empty: send {_FORMS}", param=param)
    first = value[0]
    if type(first) is int:
        if not all(type(t) is int for t in value):
            raise APIError(400, f"{param}: a list of token ids holds integers only; send {_FORMS}", param=param)
        return [value]
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"{param}: {len(value)} inputs in one call; at most {MAX_INPUTS} are allowed "
                            "(split the batch into several calls)", param=param)
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise APIError(400, f"{param}[{i}]: expected a string like the other inputs; send {_FORMS}",
                               param=f"{param}[{i}]")
        return value
    for i, item in enumerate(value):
        if not isinstance(item, list) or not all(type(t) is int for t in item):
            raise APIError(400, f"{param}[{i}]: expected a list of token ids; send {_FORMS}", param=f"{param}[{i}]")
    return value


async def token_ids(model: Model, inputs: list[str] | list[list[int]], *, add_special_tokens: bool,
                    param: str = "input") -> list[list[int]]:
    """Each input's token ids: texts tokenized (in a thread when long), id lists checked against the
    vocabulary. An empty id list is refused (the engine has nothing to pool)."""
    if inputs and isinstance(inputs[0], str):
        texts: list[str] = inputs
        if sum(map(len, texts)) <= THREADED_CHARS:
            encodings = model.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        else:
            encodings = await asyncio.to_thread(model.tokenizer.encode_batch, texts,
                                                add_special_tokens=add_special_tokens)
        ids = [e.ids for e in encodings]
    else:
        ids = inputs  # type: ignore[assignment]
        in_vocabulary(model, ids, param)
    for i, row in enumerate(ids):
        if not row:
            name = f"{param}[{i}]" if len(ids) > 1 else param
            raise APIError(400, f"{name}: the input has no tokens: nothing to pool", param=name)
    return ids


def in_vocabulary(model: Model, ids: list[list[int]], param: str = "input") -> None:
    """A 400 naming the input that holds a token id outside the vocabulary."""
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    for i, row in enumerate(ids):
        if row and not (0 <= min(row) and max(row) < vocab):
            bad = next(t for t in row if not 0 <= t < vocab)
            name = f"{param}[{i}]" if len(ids) > 1 else param
            raise APIError(400, f"{name}: token id {bad} is out of range [0, {vocab})", param=name)


def fitted(model: Model, ids: list[list[int]], texts: list[str] | None, max_model_len: int,
           truncate_prompt_tokens: int | None, truncation_side: str | None,
           add_special_tokens: bool) -> list[list[int]]:
    """Each input truncated as vLLM's renderer truncates a pooling prompt, then checked against the context
    length with vLLM's message. truncate_prompt_tokens -1 keeps the whole context (a pooling request
    generates nothing). A text with truncate_prompt_tokens alone is cut by the tokenizer, which keeps its
    special tokens ([CLS] ... [SEP]); with truncation_side too, and for token ids, the ids are sliced from
    that side (default right, HF tokenizers' default)."""
    keep = truncate_prompt_tokens
    if keep is not None:
        if keep < -1 or keep == 0:
            raise APIError(400, f"truncate_prompt_tokens={keep} is out of range: must be -1 (the whole context) "
                                "or >= 1", param="truncate_prompt_tokens")
        if keep > max_model_len:  # vLLM's check and its words
            raise APIError(400, f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = "
                                f"{max_model_len}. Please request a smaller truncation size.",
                           param="truncate_prompt_tokens")
        keep = max_model_len if keep == -1 else keep
        out = []
        for i, row in enumerate(ids):
            if len(row) <= keep:
                out.append(row)
            elif texts is not None and truncation_side is None and add_special_tokens:
                out.append(_cut_keeping_specials(model, texts[i], keep))
            else:
                out.append(row[len(row) - keep:] if truncation_side == "left" else row[:keep])
        ids = out
    for i, row in enumerate(ids):
        if len(row) > max_model_len:
            raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, "
                                f"input {i} contains {len(row)} input tokens, which exceeds this limit. Please "
                                "reduce the length of the input, or set truncate_prompt_tokens.",
                           param="input" if len(ids) == 1 else f"input[{i}]")
    return ids


def _cut_keeping_specials(model: Model, text: str, keep: int) -> list[int]:
    """`keep` tokens of a text as transformers' truncation=True, max_length=keep gives them: the text's
    own tokens cut from the right to leave room for the special tokens its post-processor adds."""
    tokenizer = model.tokenizer
    bare = tokenizer.encode(text, add_special_tokens=False)
    bare.truncate(max(keep - tokenizer.num_special_tokens_to_add(False), 0), direction="right")
    return tokenizer.post_process(bare, None, add_special_tokens=True).ids
