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
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob
from services.frontend.requests.pooling_model import PoolingModel
from services.frontend.requests.prompt_encoding import encode_texts, sliced

TASK = "classify"
_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


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
    if TASK not in tasks:  # vLLM's words (a 501 there); a 400 here, naming what the model serves
        raise APIError(400, "The model does not support Classification API: its engines serve "
                       f"{', '.join(sorted(tasks)) or 'no pooling task'}", param="model")
    req: ClassifyRequest = parse(ClassifyRequest, body if isinstance(body, bytes) else msgspec.json.encode(body))
    keep = pooling_fields.check(req, max_model_len)
    if req.messages is not None:
        raise APIError(400, "messages: classifying a chat is not supported by this server yet; send `input`",
                       param="messages")
    if req.input is msgspec.UNSET:
        raise APIError(400, "input: this field is required", param="input")
    prompts = _prompts(req.input, max_inputs)
    params = PoolingParams(task=TASK, use_activation=req.use_activation)
    inputs = []
    for i, ids in enumerate(_token_ids(prompts, model, req, keep)):
        pooling_fields.check_length("input" if len(prompts) == 1 else f"input[{i}]", len(ids), max_model_len)
        inputs.append(PoolingInput(ids, params))
    writer = ClassifyWriter(pooling_fields.response_id(req, TASK, request_id), pooling_fields.created(), model.name,
                            model.id2label)
    return PoolingJob(TASK, inputs, writer, priority=req.priority)


def _prompts(value: str | list[Any], max_inputs: int) -> list[str] | list[list[int]]:
    """`input` in vLLM's four forms as a list of texts or of token-id lists."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError(400, f"input: must not be empty: send {_FORMS}", param="input")
    if isinstance(value[0], (int, float)):
        ids = _ids(value)
        if ids is None:
            raise APIError(400, f"input: a list of token ids holds integers only; send {_FORMS}", param="input")
        return [ids]
    pooling_fields.check_count("input", len(value), max_inputs)
    if isinstance(value[0], str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise APIError(400, f"input[{i}]: expected a string like input[0]; send {_FORMS}",
                               param=f"input[{i}]")
        return value
    out = []
    for i, item in enumerate(value):
        ids = _ids(item) if isinstance(item, list) else None
        if ids is None:
            raise APIError(400, f"input[{i}]: expected a list of token ids like input[0]; send {_FORMS}",
                           param=f"input[{i}]")
        out.append(ids)
    return out


def _ids(items: list[Any]) -> list[int] | None:
    """Token ids, whole-number floats made the ids they name (vLLM's list[int] is pydantic's, lax)."""
    if all(type(t) is int for t in items):
        return items
    if all(type(t) is int or type(t) is float and t.is_integer() for t in items):
        return [int(t) for t in items]
    return None


def _token_ids(prompts: list[str] | list[list[int]], model: PoolingModel, req: ClassifyRequest,
               keep: int | None) -> list[list[int]]:
    """Texts tokenized (and cut as vLLM cuts them), token ids checked and cut from the right (vLLM's
    side for pooling models) unless truncation_side says otherwise."""
    if isinstance(prompts[0], str):
        texts: list[str] = prompts
        encoded = [e.ids for e in encode_texts(model.tokenizer, texts, add_special_tokens=req.add_special_tokens,
                                               keep=keep, side=req.truncation_side)]
        for i, ids in enumerate(encoded):
            _check_some("input" if len(encoded) == 1 else f"input[{i}]", ids)
        return encoded
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    out = []
    for i, ids in enumerate(prompts):
        param = "input" if len(prompts) == 1 else f"input[{i}]"
        _check_some(param, ids)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{param}: token id {bad} is out of range [0, {vocab})", param=param)
        out.append(ids if keep is None or len(ids) <= keep else sliced(ids, keep, req.truncation_side or "right"))
    return out


def _check_some(param: str, ids: list[int]) -> None:
    if not ids:
        raise APIError(400, f"{param}: the input has no tokens: nothing to classify", param=param)
