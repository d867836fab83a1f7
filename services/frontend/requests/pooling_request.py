"""POST /pooling (vLLM's PoolingCompletionRequest): any pooling task the engines serve, the raw pooled
values in vLLM's PoolingResponse shape (a vector, or one row per token for the token-level tasks).
Runs in each API server process."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from protocol import PoolingParams
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests import pooling_fields
from services.frontend.requests.embeddings import ENCODINGS, EmbeddingRequest, check_common, encoder, one_of
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_inputs import input_forms, token_ids
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob

POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")
# vLLM's choice of a model's task when a /pooling body names none (its ModelConfig.get_pooling_task).
_DEFAULT_ORDER = ("embed", "classify", "token_embed", "token_classify")
_REMOVED = {"score": "`score` task was removed; use `classify` instead.",
            "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead."}


class PoolingRequest(EmbeddingRequest, kw_only=True, forbid_unknown_fields=True):
    """vLLM's PoolingCompletionRequest: the embeddings body's fields and the task."""

    task: str | None = None


def default_task(tasks: Sequence[str]) -> str | None:
    return next((t for t in _DEFAULT_ORDER if t in tasks), None)


def chosen_task(task: str | None, tasks: Sequence[str]) -> str:
    """The body's task (or the model's default), refused with vLLM's message when the engines serve it not."""
    if task in _REMOVED:
        raise APIError(400, _REMOVED[task], param="task")
    served = [t for t in tasks if t in POOLING_TASKS]
    chosen = task if task is not None else default_task(served)
    if chosen is None or chosen not in served:
        raise APIError(400, f"Unsupported task: {chosen!r} Supported tasks: {tuple(tasks)}", param="task")
    return chosen


async def pooling(model: Model, body: bytes, max_model_len: Callable[[], int], tasks: Callable[[], list[str]],
                  header_id: bytes | None = None) -> PoolingJob:
    """A /pooling body as a PoolingJob; a 400 naming the field when it cannot be honoured."""
    req: PoolingRequest = parse(PoolingRequest, body)
    context = max_model_len()
    keep = check_common(req, model, context)
    one_of("encoding_format", req.encoding_format, ENCODINGS)
    if req.dimensions is not None:  # vLLM's /pooling refuses it too
        raise APIError(400, "dimensions is currently not supported", param="dimensions")
    forms = input_forms(req.input)
    task = chosen_task(req.task, tasks())
    ids = await token_ids(model, forms, add_special_tokens=req.add_special_tokens, keep=keep,
                          side=req.truncation_side, max_model_len=context)
    params = PoolingParams(task, use_activation=req.use_activation)
    rid = pooling_fields.response_id(req, "pool", header_id.decode("latin-1") if header_id else None)
    created, name, encode = pooling_fields.created(), model.name, encoder(req.encoding_format, req.endianness)

    def respond(outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        data = [{"index": i, "object": "pooling", "data": encode(out)} for i, out in enumerate(outputs)]
        return {"id": rid, "object": "list", "created": created, "model": name, "data": data,
                "usage": pooling_fields.usage(prompt_tokens)}

    return PoolingJob(task, [PoolingInput(row, params) for row in ids], respond, priority=req.priority,
                      extra={"request_id": rid})
