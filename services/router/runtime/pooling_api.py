"""vLLM's pooling API as the model runtime speaks it (router process): the request body of each call
and the reading of each answer, checked, into the runtime's results. No I/O.

Shapes are vLLM's (vllm/entrypoints/pooling/): POST /v1/embeddings answers OpenAI's
`{data: [{index, embedding}]}`, POST /classify `{data: [{index, label, probs, num_classes}]}`,
POST /rerank `{results: [{index, document, relevance_score}]}` sorted by score, not by document.
Usage: /v1/embeddings and /classify give `usage.prompt_tokens`, /rerank `usage.total_tokens` (the
same count: a pooling call generates nothing).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from services.router.runtime.models import Label

EMBED_PATH, CLASSIFY_PATH, RERANK_PATH = "/v1/embeddings", "/classify", "/rerank"
# The most inputs one call carries: the frontend refuses more (its MAX_INPUTS, OpenAI's bound on an
# embeddings call); a longer list is sent as several calls.
MAX_INPUTS = 2048
# A text past the model's context is cut, not refused (a refusal would make the signal unknown for
# every long prompt): -1 is "as many tokens as the context holds". Embed and classify keep the END of
# the text, as the in-process embedder does: the latest turn matters most. A rerank pair is cut by the
# tokenizer, longest side first from its end (a side given would slice the whole pair from the left,
# the query's special tokens first).
_KEEP_END = {"truncate_prompt_tokens": -1, "truncation_side": "left"}
_FIT = {"truncate_prompt_tokens": -1}


class BadAnswer(ValueError):
    """A worker's answer that is not what the pooling API promises: the worker's fault."""


class WrongNames(ValueError):
    """The class names known here do not fit the worker's classes: the config's fault, not the worker's."""


@dataclass(slots=True, frozen=True)
class Call:
    path: str
    body: dict[str, Any]
    expected: int  # results the answer must hold
    usage: str = "prompt_tokens"  # the answer's `usage` key that counts its tokens


# `truncate`: False for a System One call, whose client asked for this text's answer: a text past the
# context is the worker's 400 (passed on to the client), never an answer about part of it.
def embed_call(model: str, texts: list[str], *, truncate: bool = True) -> Call:
    # float: any server of the API has it (base64 is vLLM's and OpenAI's too, but not every server's).
    return Call(EMBED_PATH, {"model": model, "input": texts, "encoding_format": "float",
                             **(_KEEP_END if truncate else {})}, len(texts))


def classify_call(model: str, texts: list[str], *, truncate: bool = True) -> Call:
    return Call(CLASSIFY_PATH, {"model": model, "input": texts, **(_KEEP_END if truncate else {})}, len(texts))


def rerank_call(model: str, query: str, documents: list[str], *, truncate: bool = True) -> Call:
    # top_n 0 is vLLM's "all of them"; the router wants a score per document, in document order.
    return Call(RERANK_PATH, {"model": model, "query": query, "documents": documents, "top_n": 0,
                              **(_FIT if truncate else {})}, len(documents), usage="total_tokens")


def tokens(answer: dict[str, Any], key: str) -> int:
    """The answer's `usage[key]`, 0 when it gives none: usage is reported, never a reason to fail a call."""
    usage = answer.get("usage")
    count = usage.get(key) if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


def embeddings(answer: dict[str, Any], expected: int) -> list[list[float]]:
    rows = rows_by_index(answer, "data", expected)
    return [floats(row.get("embedding"), f"data[{i}].embedding") for i, row in enumerate(rows)]


def labels(answer: dict[str, Any], expected: int, names: Sequence[str] | None) -> list[Label]:
    """Each text's classes; `names`: the class names by index (the checkpoint's id2label), None when
    unknown here: then each probability is named LABEL_i as transformers names an unnamed class, and the
    top class takes the worker's `label`. Known names name the top class too (the worker's own label
    may be its checkpoint's LABEL_i); names that do not fit the classes raise WrongNames."""
    results = []
    for i, row in enumerate(rows_by_index(answer, "data", expected)):
        probs = floats(row.get("probs"), f"data[{i}].probs")
        if not probs:
            raise BadAnswer(f"data[{i}].probs is empty")
        top = max(range(len(probs)), key=probs.__getitem__)
        if names is not None:
            if len(names) != len(probs):
                raise WrongNames(f"{len(names)} class names for the worker's {len(probs)} classes")
            keys, label = list(names), names[top]
        else:
            keys, worker_label = [f"LABEL_{j}" for j in range(len(probs))], row.get("label")
            label = worker_label if isinstance(worker_label, str) and worker_label else keys[top]
        results.append(Label(label, probs[top], dict(zip(keys, probs, strict=True))))
    return results


def relevance(answer: dict[str, Any], expected: int) -> list[float]:
    rows = rows_by_index(answer, "results", expected)
    scores = []
    for i, row in enumerate(rows):
        score = row.get("relevance_score")
        if not isinstance(score, (int, float)) or not finite(score):
            raise BadAnswer(f"results[{i}].relevance_score: expected a finite number, got {score!r}")
        scores.append(float(score))
    return scores


def rows_by_index(answer: dict[str, Any], key: str, expected: int) -> list[dict[str, Any]]:
    """The answer's rows put in input order by their `index`: one per input, each index once."""
    rows = answer.get(key)
    if not isinstance(rows, list) or len(rows) != expected:
        got = f"{len(rows)} rows" if isinstance(rows, list) else repr(rows)[:80]
        raise BadAnswer(f"{key}: expected {expected} rows, got {got}")
    ordered: list[dict[str, Any] | None] = [None] * expected
    for row in rows:
        index = row.get("index") if isinstance(row, dict) else None
        if not isinstance(index, int) or not 0 <= index < expected or ordered[index] is not None:
            raise BadAnswer(f"{key}: a row's index is missing, repeated or out of range: {repr(row)[:80]}")
        ordered[index] = row
    return [row for row in ordered if row is not None]


def floats(value: object, where: str) -> list[float]:
    if not isinstance(value, list) or not all(finite(x) for x in value):
        raise BadAnswer(f"{where}: expected a list of finite numbers")
    return [float(x) for x in value]


def finite(x: object) -> TypeGuard[float]:  # an int passes too (a float to the type checker)
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
