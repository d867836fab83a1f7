"""POST /score (and /v1/score) and /rerank (and /v1/rerank, /v2/rerank): vLLM's ScoreRequest and
RerankRequest bodies checked and turned into a PoolingJob whose writer gives vLLM's ScoreResponse or
RerankResponse (Jina's and Cohere's shape). Runs in each API server process, from the routes.

As vLLM picks by the task the model serves: an embedding model scores a pair by the cosine of the two
embeddings (bi-encoder: task "embed", each text once), a one-label classifier by its output for the pair
encoded together (cross-encoder: task "classify", each pair one engine request, `token_type_split` where
the second text starts).

The routes' calls (no I/O here; tokenizing a large batch may go to a thread, see prompt_encoding.py):
    job = scoring.translate_score(body, model, max_model_len=..., tasks=..., request_id=<X-Request-Id>)
    job = scoring.translate_rerank(body, model, max_model_len=..., tasks=..., request_id=<X-Request-Id>)
with `model` a PoolingModel (pooling_model.py), `tasks` the engines' Ready.tasks and `request_id` the
X-Request-Id header (vLLM's response id prefers it to the body's); a 400 is raised as APIError.
`job.respond` is a picklable writer.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol import PoolingParams
from services.frontend.errors import APIError
from services.frontend.requests import pooling_fields
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_fields import MAX_INPUTS, PoolingFields
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob
from services.frontend.requests.pooling_model import PoolingModel
from services.frontend.requests.prompt_encoding import Encoded, bounded, cut_text, encode_pairs, encode_texts

PREFIX = "score"  # vLLM's response id prefix, for rerank too (one serving class answers both)
SCORE_API, RERANK_API = "Score API", "Rerank (Score) API"
# vLLM's names for the two sides of /score, newest first; one pair per body.
SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
_EPS = 1e-8  # torch's cosine_similarity clamps the norms' product here


class _Scoring(PoolingFields, kw_only=True, forbid_unknown_fields=True):
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ScoreRequest(_Scoring, kw_only=True, forbid_unknown_fields=True):
    queries: Any = msgspec.UNSET
    documents: Any = msgspec.UNSET
    items: Any = msgspec.UNSET
    data_1: Any = msgspec.UNSET
    data_2: Any = msgspec.UNSET
    text_1: Any = msgspec.UNSET
    text_2: Any = msgspec.UNSET


class RerankRequest(_Scoring, kw_only=True, forbid_unknown_fields=True):
    query: Any = msgspec.UNSET
    documents: Any = msgspec.UNSET
    top_n: int = 0  # 0: every document
    return_documents: bool | None = None  # Cohere's and Jina's; absent or true: vLLM's answer, with them


@dataclass(frozen=True, slots=True)
class PairScores:
    """One score per pair from the pooled outputs: a cross-encoder's one value per pair (n_queries
    None), or the cosine of a query's and a document's embeddings (the first n_queries outputs are the
    queries'; one query is scored against every document)."""

    n_queries: int | None

    def __call__(self, outputs: list[Pooled]) -> list[float]:
        if self.n_queries is None:
            return [_one_value(out) for out in outputs]
        queries, docs = outputs[:self.n_queries], outputs[self.n_queries:]
        if len(queries) == 1:
            queries = queries * len(docs)
        return [_cosine(q, d) for q, d in zip(queries, docs, strict=True)]


@dataclass(frozen=True, slots=True)
class ScoreWriter:
    id: str
    created: int
    model: str
    scores: PairScores

    def __call__(self, outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(self.scores(outputs))]
        return {"id": self.id, "object": "list", "created": self.created, "model": self.model, "data": data,
                "usage": pooling_fields.usage(prompt_tokens)}


@dataclass(frozen=True, slots=True)
class RerankWriter:
    """Documents by relevance, highest first (equal ones in the order sent), the first top_n of them."""

    id: str
    model: str
    scores: PairScores
    documents: list[str]
    top_n: int
    return_documents: bool

    def __call__(self, outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        for i, score in enumerate(self.scores(outputs)):
            result: dict[str, Any] = {"index": i}
            if self.return_documents:
                result["document"] = {"text": self.documents[i], "multi_modal": None}
            result["relevance_score"] = score
            results.append(result)
        results.sort(key=lambda r: r["relevance_score"], reverse=True)  # stable: ties keep their order
        if 0 < self.top_n < len(results):
            results = results[:self.top_n]
        return {"id": self.id, "model": self.model, "usage": {"prompt_tokens": prompt_tokens,
                                                             "total_tokens": prompt_tokens}, "results": results}


def translate_score(body: bytes | dict[str, Any], model: PoolingModel, *, max_model_len: int,
                    tasks: Collection[str], max_inputs: int = MAX_INPUTS,
                    request_id: str | None = None) -> PoolingJob:
    """A /score body (raw JSON, or already decoded) as the PoolingJob that answers it: 1:1, 1:N or N:N."""
    task = _task(tasks, model, SCORE_API)
    req: ScoreRequest = parse(ScoreRequest, _raw(body))
    keep = _check(req, max_model_len)
    names = _sides(req)
    firsts = _texts(names[0], getattr(req, names[0]), max_inputs)
    seconds = _texts(names[1], getattr(req, names[1]), max_inputs)
    if len(firsts) > 1 and len(firsts) != len(seconds):
        raise APIError(400, f"{names[0]}, {names[1]}: Input lengths must be either 1:1, 1:N or N:N (got "
                       f"{len(firsts)}:{len(seconds)})", param=names[1])
    _check_requests(task, names, len(firsts), len(seconds), max_inputs)
    inputs, scores, params = _pooling_inputs(task, model, req, keep, max_model_len, (names, firsts, seconds))
    writer = ScoreWriter(pooling_fields.response_id(req, PREFIX, request_id), pooling_fields.created(), model.name,
                         scores)
    return PoolingJob(task, inputs, writer, priority=req.priority, input_names=params)


def translate_rerank(body: bytes | dict[str, Any], model: PoolingModel, *, max_model_len: int,
                     tasks: Collection[str], max_inputs: int = MAX_INPUTS,
                     request_id: str | None = None) -> PoolingJob:
    """A /rerank body (raw JSON, or already decoded) as the PoolingJob that answers it."""
    task = _task(tasks, model, RERANK_API)
    req: RerankRequest = parse(RerankRequest, _raw(body))
    keep = _check(req, max_model_len)
    if req.query is msgspec.UNSET or req.documents is msgspec.UNSET:
        missing = "query" if req.query is msgspec.UNSET else "documents"
        raise APIError(400, f"{missing}: this field is required", param=missing)
    if not isinstance(req.query, str):
        raise APIError(400, "query: expected a string (this server ranks text only)", param="query")
    if req.top_n < 0:
        raise APIError(400, f"top_n={req.top_n}: must be >= 0 (0 returns every document)", param="top_n")
    docs = _texts("documents", req.documents, max_inputs)
    names = ("query", "documents")
    _check_requests(task, names, 1, len(docs), max_inputs)
    inputs, scores, params = _pooling_inputs(task, model, req, keep, max_model_len, (names, [req.query], docs))
    writer = RerankWriter(pooling_fields.response_id(req, PREFIX, request_id), model.name, scores, docs,
                          req.top_n, req.return_documents is not False)
    return PoolingJob(task, inputs, writer, priority=req.priority, input_names=params)


def _raw(body: bytes | dict[str, Any]) -> bytes:
    return body if isinstance(body, bytes) else msgspec.json.encode(body)


def _task(tasks: Collection[str], model: PoolingModel, api: str) -> str:
    """The task vLLM scores with on this model, by its own pooling task: embed (a bi-encoder: the cosine of
    two embeddings) or classify (a cross-encoder: one label only); a 400 with vLLM's words otherwise (a 501
    or a 404 there)."""
    own = model.pooling_task(tasks)
    if own == "embed":
        return "embed"
    if own == "classify":
        if model.num_labels != 1:
            raise APIError(400, f"The model does not support {api}: scoring needs a cross-encoder (one label); "
                           f"this classifier has {model.num_labels} (use /classify)", param="model")
        return "classify"
    raise APIError(400, f"The model does not support {api}: scoring needs an embedding model or a cross-encoder "
                   f"(late interaction is not supported by this server); {model.task_words(tasks)}", param="model")


def _check(req: _Scoring, max_model_len: int) -> int | None:
    keep = pooling_fields.check(req, max_model_len)
    for name in ("max_tokens_per_query", "max_tokens_per_doc"):
        value = getattr(req, name)
        if value < 0:  # vLLM's checks first, so a bad value gets vLLM's answer
            raise APIError(400, f"{name} must be a non-negative integer", param=name)
        if value >= max_model_len:
            raise APIError(400, f"{name} ({value}) must be less than max_model_len ({max_model_len}).", param=name)
    for name in ("instruction", "chat_template_kwargs"):
        if getattr(req, name) is not None:
            raise APIError(400, f"{name}: score templates are not supported by this server (vLLM reads it only "
                           "when started with a --chat-template)", param=name)
    return keep


def _sides(req: ScoreRequest) -> tuple[str, str]:
    """The one pair of vLLM's names the body uses; a 400 when it uses none, half of one, or two."""
    given = [name for name in ("queries", "documents", "items", "data_1", "data_2", "text_1", "text_2")
             if getattr(req, name) is not msgspec.UNSET]
    for pair in SIDES:
        if sorted(pair) == sorted(given):
            return pair
    pairs = "; ".join(" and ".join(pair) for pair in SIDES)
    sent = ", ".join(given) or "none of them"
    raise APIError(400, f"send the two sides to score under one pair of names ({pairs}); the body has {sent}",
                   param=given[0] if given else "queries")


def _texts(name: str, value: Any, max_inputs: int) -> list[str]:
    """One side as a list of strings: a string, or a non-empty list of them."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise APIError(400, f"{name}: expected a string or a list of strings (this server scores text only)",
                       param=name)
    if not value:
        raise APIError(400, f"{name}: at least one text must be given", param=name)
    pooling_fields.check_count(name, len(value), max_inputs)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise APIError(400, f"{name}[{i}]: expected a string (this server scores text only)",
                           param=f"{name}[{i}]")
    return value


def _check_requests(task: str, names: tuple[str, str], n_firsts: int, n_seconds: int, max_inputs: int) -> None:
    """The bound on inputs a call (pooling_fields.MAX_INPUTS) counted in the engine requests the call
    makes, not per side: a pair each (cross-encoder), a text each (bi-encoder: both sides)."""
    count = n_seconds if task == "classify" else n_firsts + n_seconds
    if count > max_inputs:
        raise APIError(400, f"{names[0]}, {names[1]}: this call needs {count} engine requests ({n_firsts} and "
                       f"{n_seconds} texts, {'a pair' if task == 'classify' else 'a text'} each); at most "
                       f"{max_inputs} are allowed (split the batch into several calls)", param=names[1])


def _pooling_inputs(task: str, model: PoolingModel, req: _Scoring, keep: int | None, max_model_len: int,
                    sides: tuple[tuple[str, str], list[str], list[str]]
                    ) -> tuple[list[PoolingInput], PairScores, list[str]]:
    """The engine requests, how their outputs become scores and the field each request comes from:
    each pair encoded together (cross-encoder: named by its document), or each text once (bi-encoder:
    the first side's texts, then the second's)."""
    (first, second), firsts, seconds = sides
    # vLLM's character bound on each text before any tokenizing (prompt_encoding.bounded).
    firsts = bounded(model.tokenizer, firsts, [_name(first, i, len(firsts)) for i in range(len(firsts))],
                     max_model_len=max_model_len, keep=keep, side=req.truncation_side)
    seconds = bounded(model.tokenizer, seconds, [_name(second, i, len(seconds)) for i in range(len(seconds))],
                      max_model_len=max_model_len, keep=keep, side=req.truncation_side)
    if req.max_tokens_per_query:
        firsts = [cut_text(model.tokenizer, text, req.max_tokens_per_query) for text in firsts]
    if req.max_tokens_per_doc:
        seconds = [cut_text(model.tokenizer, text, req.max_tokens_per_doc) for text in seconds]
    if task == "classify":
        encoded = encode_pairs(model.tokenizer, firsts, seconds, keep=keep, side=req.truncation_side,
                               token_types=model.token_types, use_sep_token=model.use_sep_token,
                               only_second=req.max_tokens_per_doc > 0, max_model_len=max_model_len,
                               first_name=first)
        params = [f"{second}[{i}]" if len(seconds) > 1 else second for i in range(len(encoded))]
        scores = PairScores(None)
    else:
        encoded = encode_texts(model.tokenizer, firsts + seconds, add_special_tokens=True, keep=keep,
                               side=req.truncation_side)
        params = [_name(first, i, len(firsts)) for i in range(len(firsts))]
        params += [_name(second, i, len(seconds)) for i in range(len(seconds))]
        scores = PairScores(len(firsts))
    inputs = [_input(task, req, enc, param, max_model_len) for enc, param in zip(encoded, params, strict=True)]
    return inputs, scores, params


def _name(side: str, index: int, count: int) -> str:
    return f"{side}[{index}]" if count > 1 else side


def _input(task: str, req: _Scoring, enc: Encoded, param: str, max_model_len: int) -> PoolingInput:
    pooling_fields.check_length(param, len(enc.ids), max_model_len)
    return PoolingInput(enc.ids, PoolingParams(task=task, use_activation=req.use_activation,
                                               token_type_split=enc.token_type_split))


def _one_value(out: Pooled) -> float:
    if len(out) != 1 or not isinstance(out[0], float):
        raise ValueError(f"a cross-encoder's output is one value, the engine sent {len(out)}")
    return out[0]


def _cosine(x: Pooled, y: Pooled) -> float:
    dot = sum(map(operator.mul, x, y))
    norms = sum(map(operator.mul, x, x)) * sum(map(operator.mul, y, y))
    return float(dot / max(math.sqrt(norms), _EPS))
