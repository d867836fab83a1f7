"""POST /pooling (vLLM's PoolingCompletionRequest): the model's own pooling task (pooling_model.py), the raw
pooled values in vLLM's PoolingResponse shape (a vector, or one row per token for the token-level tasks).
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
from services.frontend.requests.pooling_model import POOLING_TASKS

_REMOVED = {"score": "`score` task was removed; use `classify` instead.",
            "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead."}


class PoolingRequest(EmbeddingRequest, kw_only=True, forbid_unknown_fields=True):
    """vLLM's PoolingCompletionRequest: the embeddings body's fields and the task."""

    task: str | None = None


def chosen_task(task: str | None, tasks: Sequence[str], own: str | None) -> str:
    """The body's task, or the model's own (`own`, of the served `tasks`) when it names none. vLLM runs
    /pooling for the model's own task only: another task is refused with vLLM's message, which says
    whether the engines serve it at all."""
    if task in _REMOVED:
        raise APIError(400, _REMOVED[task], param="task")
    chosen = task if task is not None else own
    if chosen is None or chosen not in tasks or chosen not in POOLING_TASKS:
        raise APIError(400, f"Unsupported task: {chosen!r} Supported tasks: {tuple(tasks)}", param="task")
    if chosen != own:  # vLLM points to its --pooler-config.task, which this server does not have
        raise APIError(400, f"Unsupported task: {chosen!r}: /pooling runs only the model's own pooling_task, "
                            f"{own!r} (vLLM switches it with --pooler-config.task, which this server does not "
                            "have)", param="task")
    return chosen


async def pooling(model: Model, body: bytes, max_model_len: Callable[[], int], tasks: Callable[[], list[str]],
                  own_task: Callable[[Sequence[str]], str | None], header_id: bytes | None = None) -> PoolingJob:
    """A /pooling body as a PoolingJob; a 400 naming the field when it cannot be honoured."""
    req: PoolingRequest = parse(PoolingRequest, body)
    context = max_model_len()
    keep = check_common(req, model, context)
    one_of("encoding_format", req.encoding_format, ENCODINGS)
    if req.dimensions is not None:  # vLLM's /pooling refuses it too
        raise APIError(400, "dimensions is currently not supported", param="dimensions")
    forms = input_forms(req.input)
    served = tasks()
    task = chosen_task(req.task, served, own_task(served))
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
