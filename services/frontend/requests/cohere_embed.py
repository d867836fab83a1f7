"""POST /v2/embed (Cohere's embed API as vLLM serves it, text only): the body checked and turned into a
PoolingJob whose writer answers in vLLM's CohereEmbedResponse shape, each asked embedding type (float,
binary, ubinary, base64). Runs in each API server process."""
from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from protocol import PoolingParams
from protocol.pooled import pack
from services.frontend.engine_client.lora import no_such_model
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.embeddings import check_dimensions
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_fields import check_priority
from services.frontend.requests.pooling_inputs import input_forms, token_ids
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob

EMBEDDING_TYPES = ("float", "binary", "ubinary", "base64")


class CohereEmbedRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's CohereEmbedRequest, its fields and defaults."""

    model: str | None = None
    input_type: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[Any] | None = None
    output_dimension: int | None = None
    embedding_types: list[str] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None
    priority: int = 0


def task_instructions(model: Model) -> dict[str, str]:
    """The model's input_type prefixes, where vLLM finds them: config.json's `task_instructions`, else
    config_sentence_transformers.json's `prompts`."""
    for name, key in (("config.json", "task_instructions"), ("config_sentence_transformers.json", "prompts")):
        path = Path(model.path) / name
        try:
            found = json.loads(path.read_text()).get(key) if path.is_file() else None
        except (OSError, ValueError):
            found = None
        if isinstance(found, dict) and found:
            return {k: v for k, v in found.items() if isinstance(v, str)}
    return {}


def _texts(req: CohereEmbedRequest, model: Model) -> list[str]:
    """The texts, each with its input_type prefix; a 400 naming the field vLLM would refuse or this
    server cannot serve."""
    given = [name for name in ("texts", "images", "inputs") if getattr(req, name) is not None]
    if len(given) != 1 or not getattr(req, given[0]):
        raise APIError(400, "Exactly one of texts, images, or inputs must be provided, and it must be non-empty",
                       param="texts")
    if given[0] != "texts":
        raise APIError(400, f"{given[0]}: this server embeds text only; send `texts`", param=given[0])
    texts = req.texts or []
    if req.input_type is None:
        return texts
    prefixes = task_instructions(model)
    if not prefixes:
        raise APIError(400, f"Unsupported input_type {req.input_type!r}. This model does not define any "
                            "input_type task instructions.", param="input_type")
    if req.input_type not in prefixes:
        raise APIError(400, f"Unsupported input_type {req.input_type!r}. Supported values: "
                            f"{', '.join(sorted(prefixes))}", param="input_type")
    if model.template is not None:  # vLLM renders the prefix as a system message through the template
        raise APIError(400, "input_type: a task instruction through the chat template is not supported by this "
                            "server", param="input_type")
    return [prefixes[req.input_type] + t for t in texts]


def _truncation(req: CohereEmbedRequest, max_model_len: int) -> tuple[int | None, str | None]:
    """vLLM's mapping of `truncate` and `max_tokens` to (tokens kept, side)."""
    if req.max_tokens is not None and not 1 <= req.max_tokens <= max_model_len:
        raise APIError(400, f"max_tokens={req.max_tokens} is out of range: 1 to max_model_len = {max_model_len}",
                       param="max_tokens")
    if req.truncate == "NONE":
        return None, None
    keep = req.max_tokens if req.max_tokens is not None else max_model_len
    return keep, "left" if req.truncate == "START" else None


def _packed_bits(vector: list[float], signed: bool) -> list[int]:
    """Cohere's binary types: one bit per value (>= 0 is 1), MSB first, 8 a byte; int8 for `binary`."""
    out = []
    for i in range(0, len(vector), 8):
        chunk = vector[i:i + 8]
        byte = 0
        for v in chunk:
            byte = (byte << 1) | (v >= 0)
        byte <<= 8 - len(chunk)  # a last partial byte is padded with zeros, as numpy's packbits
        out.append(byte - 128 if signed else byte)
    return out


def _typed(outputs: list[Pooled], types: list[str]) -> dict[str, Any]:
    vectors: list[list[float]] = outputs  # type: ignore[assignment]  # embed: one vector per input
    typed: dict[str, Any] = {}
    for kind in types:
        if kind == "float":
            typed["float"] = vectors
        elif kind in ("binary", "ubinary"):
            typed[kind] = [_packed_bits(v, kind == "binary") for v in vectors]
        else:  # base64: little-endian float32, as vLLM's
            typed["base64"] = [base64.b64encode(pack(v)).decode("ascii") for v in vectors]
    return typed


async def cohere_embed(model: Model, body: bytes, max_model_len: Callable[[], int],
                       header_id: bytes | None = None) -> PoolingJob:
    """A /v2/embed body as a PoolingJob; a 400 naming the field when it cannot be honoured."""
    req: CohereEmbedRequest = parse(CohereEmbedRequest, body)
    if req.model is not None and req.model != model.name:
        raise no_such_model(req.model)
    check_priority(req.priority)
    types = req.embedding_types or ["float"]
    for i, kind in enumerate(types):
        if kind not in EMBEDDING_TYPES:
            raise APIError(400, f"embedding_types[{i}]: {kind!r} is not supported; allowed: "
                                f"{', '.join(EMBEDDING_TYPES)}", param=f"embedding_types[{i}]")
    check_dimensions(req.output_dimension, model, "output_dimension")
    size = req.output_dimension or (model.embedding.size if model.embedding else None)
    if {"binary", "ubinary"} & set(types) and size is not None and size % 8:
        raise APIError(400, "embedding_types: binary types need an embedding size that is a multiple of 8, got "
                            f"{size}", param="embedding_types")
    context = max_model_len()
    texts = _texts(req, model)
    keep, side = _truncation(req, context)
    ids = await token_ids(model, input_forms(texts, "texts"), add_special_tokens=True, keep=keep, side=side,
                          max_model_len=context, param="texts")
    if req.truncate == "NONE" and req.max_tokens is not None:
        for i, row in enumerate(ids):
            if len(row) > req.max_tokens:  # vLLM's words
                raise APIError(400, f"Input of {len(row)} tokens exceeds max_tokens={req.max_tokens} with "
                                    "truncate=NONE. Set truncate to END or START to allow truncation.",
                               param=f"texts[{i}]")
    params = PoolingParams("embed", dimensions=req.output_dimension)
    rid = f"embd-{header_id.decode('latin-1') if header_id else uuid.uuid4().hex}"

    def respond(outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        return {"id": rid, "embeddings": _typed(outputs, types), "texts": req.texts,
                "meta": {"api_version": {"version": "2"},
                         "billed_units": {"input_tokens": prompt_tokens, "image_tokens": 0}},
                "response_type": "embeddings_by_type"}

    return PoolingJob("embed", [PoolingInput(row, params) for row in ids], respond, priority=req.priority,
                      extra={"request_id": rid}, input_names=[f"texts[{i}]" for i in range(len(ids))],
                      field_names={"dimensions": "output_dimension"})
