"""POST /pooling (vLLM's PoolingCompletionRequest): any pooling task the engines serve, the raw pooled
values in vLLM's PoolingResponse shape (a vector, or one row per token for the token-level tasks).
Runs in each API server process."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from protocol import PoolingParams
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.embeddings import ENCODINGS, check_common, encoder, one_of, response_id, usage
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_inputs import fitted, input_forms, token_ids
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob

POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")
# vLLM's choice of a model's task when a /pooling body names none (its ModelConfig.get_pooling_task).
_DEFAULT_ORDER = ("embed", "classify", "token_embed", "token_classify")
_REMOVED = {"score": "`score` task was removed; use `classify` instead.",
            "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead."}


class PoolingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: str | list[Any]
    model: str | None = None
    task: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    padding: str | None = None
    truncation_side: str | None = None
    request_id: str | None = None
    priority: int = 0
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    add_special_tokens: bool = True
    embed_dtype: str = "float32"
    endianness: str = "native"
    use_activation: bool | None = None
    normalize: Any = msgspec.UNSET
    messages: Any = msgspec.UNSET


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
    check_common(req, model)
    one_of("encoding_format", req.encoding_format, ENCODINGS)
    if req.dimensions is not None:  # vLLM's /pooling refuses it too
        raise APIError(400, "dimensions is currently not supported", param="dimensions")
    forms = input_forms(req.input)
    task = chosen_task(req.task, tasks())
    ids = await token_ids(model, forms, add_special_tokens=req.add_special_tokens)
    ids = fitted(model, ids, forms if isinstance(forms[0], str) else None, max_model_len(),
                 req.truncate_prompt_tokens, req.truncation_side, req.add_special_tokens)
    params = PoolingParams(task, use_activation=req.use_activation)
    rid, created, name = response_id("pool", req.request_id, header_id), int(time.time()), model.name
    encode = encoder(req.encoding_format, req.endianness)

    def respond(outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        data = [{"index": i, "object": "pooling", "data": encode(out)} for i, out in enumerate(outputs)]
        return {"id": rid, "object": "list", "created": created, "model": name, "data": data,
                "usage": usage(prompt_tokens)}

    return PoolingJob(task, [PoolingInput(row, params) for row in ids], respond, priority=req.priority,
                      extra={"request_id": rid, "cache_salt": req.cache_salt})
