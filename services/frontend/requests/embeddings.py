"""POST /v1/embeddings (OpenAI's, with vLLM's extra fields): the body checked and turned into a PoolingJob
whose writer answers in vLLM's EmbeddingResponse shape, floats or base64 of float32. Runs in each API
server process."""
from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Callable
from typing import Any

import msgspec

from protocol import PoolingParams
from protocol.pooled import pack
from services.frontend.engine_client.lora import no_such_model
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests import pooling_fields
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_fields import PoolingFields
from services.frontend.requests.pooling_inputs import input_forms, token_ids
from services.frontend.requests.pooling_job import Pooled, PoolingInput, PoolingJob

ENCODINGS = ("float", "base64")
ENDIANNESS = ("native", "little", "big")


class EmbeddingRequest(PoolingFields, kw_only=True, forbid_unknown_fields=True):
    """vLLM's EmbeddingCompletionRequest: the fields every pooling body shares (pooling_fields.py), OpenAI's
    `input`, `encoding_format` and `dimensions`, and vLLM's own."""

    input: str | list[Any]
    encoding_format: str = "float"
    dimensions: int | None = None
    add_special_tokens: bool = True
    embed_dtype: str = "float32"
    endianness: str = "native"
    messages: Any = msgspec.UNSET  # vLLM's chat form: refused, not ignored


def one_of(param: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise APIError(400, f"{param}: {value!r} is not supported; allowed: {', '.join(allowed)}", param=param)


def check_common(req: Any, model: Model, max_model_len: int) -> int | None:
    """The fields every pooling body shares, refused by name when they cannot be honoured (pooling_fields.py
    checks vLLM's common ones), and the `model`; returns how many tokens an input keeps (None: all)."""
    if req.model is not None and req.model != model.name:
        raise no_such_model(req.model)  # no LoRA adapters on pooling routes
    if req.messages is not msgspec.UNSET:
        raise APIError(400, "messages: chat-form pooling input is not supported by this server; send `input` "
                            "(a string, strings or token ids)", param="messages")
    one_of("embed_dtype", req.embed_dtype, ("float32",))
    one_of("endianness", req.endianness, ENDIANNESS)
    return pooling_fields.check(req, max_model_len)


def check_dimensions(dimensions: int | None, model: Model, param: str = "dimensions") -> None:
    """A Matryoshka cut, refused as vLLM refuses it (its PoolingParams' messages) when the model cannot."""
    if dimensions is None:
        return
    facts, name = model.embedding, model.name
    if facts is None or not facts.matryoshka:
        raise APIError(400, f"Model {name!r} does not support Matryoshka embeddings; dimensions must be unset "
                            f"(received dimensions={dimensions}).", param=param)
    if facts.size is not None and not 1 <= dimensions <= facts.size:
        raise APIError(400, f"Model {name!r} only supports dimensions in range [1, {facts.size}], got {dimensions}.",
                       param=param)
    if facts.dimensions is not None and dimensions not in facts.dimensions:
        raise APIError(400, f"Model {name!r} only supports Matryoshka dimensions {list(facts.dimensions)}, got "
                            f"{dimensions}.", param=param)


def encoder(encoding_format: str, endianness: str) -> Callable[[Pooled], list[float] | list[list[float]] | str]:
    """How one pooled output appears in the body: the floats, or base64 of its float32 bytes in the
    asked byte order (native: this host's, as vLLM's), as OpenAI's client decodes it."""
    if encoding_format == "float":
        return lambda values: values
    big = endianness == "big" or endianness == "native" and sys.byteorder == "big"

    def b64(values: Pooled) -> str:
        data = pack(values)  # little-endian float32, rows flattened, in C loops (protocol/pooled.py)
        if big:
            swapped = array("f", data)
            swapped.byteswap()
            data = swapped.tobytes()
        return base64.b64encode(data).decode("ascii")

    return b64


async def embeddings(model: Model, body: bytes, max_model_len: Callable[[], int],
                     header_id: bytes | None = None) -> PoolingJob:
    """A /v1/embeddings body as a PoolingJob; a 400 naming the field when it cannot be honoured."""
    req: EmbeddingRequest = parse(EmbeddingRequest, body)
    context = max_model_len()
    keep = check_common(req, model, context)
    one_of("encoding_format", req.encoding_format, ENCODINGS)
    check_dimensions(req.dimensions, model)
    forms = input_forms(req.input)
    ids = await token_ids(model, forms, add_special_tokens=req.add_special_tokens, keep=keep,
                          side=req.truncation_side, max_model_len=context)
    params = PoolingParams("embed", dimensions=req.dimensions, use_activation=req.use_activation)
    rid = pooling_fields.response_id(req, "embd", header_id.decode("latin-1") if header_id else None)
    created, name, encode = pooling_fields.created(), model.name, encoder(req.encoding_format, req.endianness)

    def respond(outputs: list[Pooled], prompt_tokens: int) -> dict[str, Any]:
        data = [{"index": i, "object": "embedding", "embedding": encode(out)} for i, out in enumerate(outputs)]
        return {"id": rid, "object": "list", "created": created, "model": name, "data": data,
                "usage": pooling_fields.usage(prompt_tokens)}

    return PoolingJob("embed", [PoolingInput(row, params) for row in ids], respond, priority=req.priority,
                      extra={"request_id": rid})
