"""POST /classify: vLLM's ClassificationRequest body (its completion form: `input`) checked and turned
into a PoolingJob, one engine request per input with task "classify", whose writer gives vLLM's
ClassificationResponse. Runs in each API server process, from the route.

The route's call (no I/O here; tokenizing a large batch may go to a thread, see prompt_encoding.py):
    job = classify.translate(body, model, max_model_len=..., tasks=..., request_id=<X-Request-Id>)
where `model` is a PoolingModel (pooling_model.py) built once at start and `tasks` the engines'
Ready.tasks; a 400 is raised as APIError. `job.respond(outputs, prompt_tokens)` is a picklable
ClassifyWriter.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from protocol import PoolingParams
from services.frontend.errors import APIError
from services.frontend.requests import pooling_fields
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_fields import MAX_INPUTS, PoolingFields
from services.frontend.requests.pooling_inputs import encode_inputs, input_forms
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob
from services.frontend.requests.pooling_model import PoolingModel

TASK = "classify"


class ClassifyRequest(PoolingFields, kw_only=True, forbid_unknown_fields=True):
    input: str | list[Any] | msgspec.UnsetType = msgspec.UNSET
    add_special_tokens: bool = True
    messages: list[Any] | None = None  # vLLM's chat form: refused here


@dataclass(frozen=True, slots=True)
class ClassifyWriter:
    """The body of a /classify answer from each input's class probabilities (or logits, with
    use_activation false): the label is the top class's name, as vLLM picks it."""

    id: str
    created: int
    model: str
    id2label: Mapping[int, str]

    def __call__(self, outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        data = []
        for index, pooled in enumerate(outputs):
            probs = cast("list[float]", list(pooled))  # a list even if the engine's values came as a float32 array view
            top = max(range(len(probs)), key=probs.__getitem__)  # the first of equal ones, as numpy's argmax
            data.append({"index": index, "label": self.id2label.get(top), "probs": probs, "num_classes": len(probs)})
        return {"id": self.id, "object": "list", "created": self.created, "model": self.model, "data": data,
                "usage": pooling_fields.usage(prompt_tokens)}


def translate(body: bytes | dict[str, Any], model: PoolingModel, *, max_model_len: int, tasks: Collection[str],
              max_inputs: int = MAX_INPUTS, request_id: str | None = None) -> PoolingJob:
    """A /classify body (raw JSON, or already decoded) as the PoolingJob that answers it. `request_id`:
    the X-Request-Id header, which vLLM's response id prefers to the body's."""
    if model.pooling_task(tasks) != TASK:  # vLLM's words (a 501 there); a 400 here, naming what the model does
        raise APIError(400, f"The model does not support Classification API: {model.task_words(tasks)}",
                       param="model")
    req: ClassifyRequest = parse(ClassifyRequest, body if isinstance(body, bytes) else msgspec.json.encode(body))
    keep = pooling_fields.check(req, max_model_len)
    if req.messages is not None:
        raise APIError(400, "messages: classifying a chat is not supported by this server yet; send `input`",
                       param="messages")
    if req.input is msgspec.UNSET:
        raise APIError(400, "input: this field is required", param="input")
    prompts = input_forms(req.input, "input", max_inputs)
    ids = encode_inputs(model.tokenizer, prompts, add_special_tokens=req.add_special_tokens, keep=keep,
                        side=req.truncation_side, max_model_len=max_model_len)
    params = PoolingParams(task=TASK, use_activation=req.use_activation)
    inputs = [PoolingInput(row, params) for row in ids]
    writer = ClassifyWriter(pooling_fields.response_id(req, TASK, request_id), pooling_fields.created(), model.name,
                            model.id2label)
    return PoolingJob(TASK, inputs, writer, priority=req.priority)
