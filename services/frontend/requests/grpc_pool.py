"""A gRPC PoolRequest (Inference.Embed and Inference.Classify, protocol/grpc/fleet/v1/fleet.proto) checked
and turned into a PoolingJob with the pooling routes' own checks: token ids in the vocabulary, at most
MAX_INPUTS inputs, truncation and the context length, a Matryoshka cut only where the model has one.
Runs on API server 0's event loop."""
from __future__ import annotations

import os
from typing import Any

from protocol import PoolingParams
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.embeddings import check_dimensions
from services.frontend.requests.pooling_fields import MAX_INPUTS, check_count, check_length, keep_tokens
from services.frontend.requests.pooling_inputs import in_vocabulary
from services.frontend.requests.pooling_job import PoolingInput, PoolingJob
from services.frontend.requests.prompt_encoding import sliced


def pool_job(request: Any, task: str, model: Model, max_model_len: int) -> PoolingJob:
    """The PoolRequest's inputs as one engine request each (`task`: "embed" or "classify"); the job's
    writer is unused (the gRPC face writes a PoolResponse)."""
    ids = [list(item.token_ids) for item in request.inputs]
    if not ids:
        raise APIError(400, "inputs: must not be empty", param="inputs")
    check_count("inputs", len(ids), MAX_INPUTS)
    for i, row in enumerate(ids):
        if not row:
            raise APIError(400, f"inputs[{i}].token_ids: must not be empty", param=f"inputs[{i}].token_ids")
    in_vocabulary(model.tokenizer, ids, "inputs")
    dimensions = request.dimensions if request.HasField("dimensions") else None
    if dimensions is not None and task != "embed":
        raise APIError(400, "dimensions: only Embed takes a Matryoshka cut", param="dimensions")
    check_dimensions(dimensions, model)
    keep = request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None
    keep = keep_tokens(keep, max_model_len)
    if keep is not None:
        ids = [sliced(row, keep, "right") if len(row) > keep else row for row in ids]
    for i, row in enumerate(ids):
        check_length(f"inputs[{i}].token_ids", len(row), max_model_len)
    use_activation = request.use_activation if request.HasField("use_activation") else None
    params = PoolingParams(task, dimensions=dimensions, use_activation=use_activation)
    request_id = request.request_id or f"{'embd' if task == 'embed' else 'classify'}-{os.urandom(16).hex()}"
    return PoolingJob(task, [PoolingInput(row, params) for row in ids], lambda outputs, tokens: {},
                      priority=request.priority, extra={"request_id": request_id},
                      input_names=[f"inputs[{i}].token_ids" for i in range(len(ids))])
