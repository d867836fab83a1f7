"""Inference.Embed and Inference.Classify: a PoolRequest through the pooling routes' stages (the checks of
requests/grpc_pool.py, then generation/pooling.py's placement and gathering), answered with each input's
float32 values as bytes. A cancelled call (the client left, a deadline) aborts every input still running.
Runs on API server 0's event loop."""
from __future__ import annotations

from typing import Any

import grpc

from protocol.grpc import pb2
from protocol.pooled import pack
from services.frontend.engine_client.inflight import EngineFailure
from services.frontend.errors import APIError
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.grpc_api.rpc import Failed, failed, status_of
from services.frontend.requests.grpc_pool import pool_job
from services.frontend.requests.pooling_job import Pooled


async def pool(core: FrontendCore, request: Any, task: str, api: str) -> Any:
    """The call's PoolResponse. Raises Failed."""
    if core.shutdown.draining:
        raise Failed(grpc.StatusCode.UNAVAILABLE, "the frontend is shutting down; send the request to another replica")
    try:
        core.refuse_task((task,), api)
        job = pool_job(request, task, core.model, core.max_model_len())
        pinned = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
        with core.pooling.launch(job, pinned) as run:
            try:
                outputs, prompt_tokens = await core.pooling.gather(run)
            except EngineFailure as exc:
                raise Failed(status_of(exc.status), str(exc)) from None
    except APIError as exc:
        raise failed(exc) from None
    return pb2.PoolResponse(request_id=job.extra["request_id"], outputs=[values(out) for out in outputs],
                            usage=pb2.Usage(prompt_tokens=prompt_tokens))


def values(pooled: Pooled) -> Any:
    """One input's values as little-endian float32 bytes and their shape (a vector, or rows per token)."""
    shape = [len(pooled), len(pooled[0])] if pooled and isinstance(pooled[0], list) else [len(pooled)]
    return pb2.PooledValues(values=pack(pooled), shape=shape)
