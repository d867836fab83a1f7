"""The RlControl service: pause and resume, sleep and wake, and weight updates, as utility calls on every
ready engine rank. Runs on API server 0's event loop."""
from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc

from protocol.grpc import pb2, pb2_grpc
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.grpc_api.rpc import CallContext, Failed, Ranks, guard, need

# UpdateWeights sends the engines a batch of tensors once this many bytes have come in (and at the end).
WEIGHT_BATCH_BYTES = 8 << 20
WEIGHT_BATCHES_IN_FLIGHT = 2
MAX_ITEM_BYTES = 16  # the widest element of any dtype (complex128): a tensor's bytes are at most 16 per element

_MODES = {pb2.PAUSE_MODE_UNSPECIFIED: "keep", pb2.PAUSE_MODE_KEEP: "keep", pb2.PAUSE_MODE_ABORT: "abort",
          pb2.PAUSE_MODE_WAIT: "wait"}
_MODE_ENUM = {"keep": pb2.PAUSE_MODE_KEEP, "abort": pb2.PAUSE_MODE_ABORT, "wait": pb2.PAUSE_MODE_WAIT}


class RlControl(pb2_grpc.RlControlServicer):
    """Pause and resume, sleep and wake, and weight updates, on every ready rank. A weight update is
    StartWeightUpdate, UpdateWeights (tensors streamed in; sent on to the engines in batches of about
    WEIGHT_BATCH_BYTES as raw frames), FinishWeightUpdate (the new weights serve from then on)."""

    def __init__(self, core: FrontendCore) -> None:
        self._ranks = Ranks(core)

    async def PauseGeneration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def pause() -> Any:
            mode = _MODES.get(request.mode)
            if mode is None:
                raise Failed(grpc.StatusCode.INVALID_ARGUMENT, f"mode={request.mode} is not a PauseMode: allowed "
                                                                "PAUSE_MODE_KEEP, PAUSE_MODE_ABORT, PAUSE_MODE_WAIT")
            results = await self._ranks.call(context, "pause", mode=mode)
            return pb2.PauseGenerationResponse(aborted=sum(int((r or {}).get("aborted", 0)) for r in results))
        return await guard(context, pause())

    async def ResumeGeneration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def resume() -> Any:
            await self._ranks.call(context, "resume")
            return pb2.ResumeGenerationResponse()
        return await guard(context, resume())

    async def IsPaused(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def paused() -> Any:
            results = [r or {} for r in await self._ranks.call(context, "is_paused")]
            mode = next((r.get("mode") for r in results if r.get("paused")), None)
            return pb2.IsPausedResponse(paused=any(r.get("paused") for r in results),
                                        mode=_MODE_ENUM.get(mode or "", pb2.PAUSE_MODE_UNSPECIFIED),
                                        held=sum(int(r.get("held", 0)) for r in results))
        return await guard(context, paused())

    async def Sleep(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def sleep() -> Any:
            level = request.level or 1
            if level not in (1, 2):
                raise Failed(grpc.StatusCode.INVALID_ARGUMENT, f"level={level} is out of range: allowed 1 or 2")
            await self._ranks.call(context, "sleep", level=level)
            return pb2.SleepResponse()
        return await guard(context, sleep())

    async def WakeUp(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def wake() -> Any:
            await self._ranks.call(context, "wake_up")
            return pb2.WakeUpResponse()
        return await guard(context, wake())

    async def IsSleeping(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def sleeping() -> Any:
            return pb2.IsSleepingResponse(sleeping=any(await self._ranks.call(context, "is_sleeping")))
        return await guard(context, sleeping())

    async def StartWeightUpdate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def start() -> Any:
            await self._ranks.call(context, "start_weight_update")
            return pb2.StartWeightUpdateResponse()
        return await guard(context, start())

    async def UpdateWeights(self, request_iterator: AsyncIterator[Any], context: CallContext) -> Any:
        """grpc.aio's handler, and the gRPC port's (upload_call.py), which serves the method itself."""
        async def update() -> Any:
            self._ranks.ready()
            metas: list[dict[str, Any]] = []
            frames: list[bytes] = []
            batch = tensors = total = 0
            # Batches go on while the next ones come in (each rank loads them in order), at most
            # WEIGHT_BATCHES_IN_FLIGHT at a time: memory stays bounded, and the stream, the send and the
            # engine's load overlap.
            sent: list[asyncio.Task[list[Any]]] = []
            try:
                async for t, data in _tensors(request_iterator):
                    metas.append({"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "frame": len(frames),
                                  "offset": 0, "nbytes": len(data)})
                    frames.append(data)
                    batch += len(data)
                    tensors += 1
                    total += len(data)
                    if batch >= WEIGHT_BATCH_BYTES:
                        await self._send(context, sent, metas, frames)
                        metas, frames, batch = [], [], 0
                if metas:
                    await self._send(context, sent, metas, frames)
                for task in sent:
                    await task
            finally:
                for task in sent:
                    task.cancel()
            return pb2.UpdateWeightsResponse(tensors=tensors, bytes=total)
        return await guard(context, update())

    async def _send(self, context: CallContext, sent: list[asyncio.Task[list[Any]]],
                    metas: list[dict[str, Any]], frames: list[bytes]) -> None:
        """One batch on its way to every rank; waits while WEIGHT_BATCHES_IN_FLIGHT are (and raises the
        first one's failure)."""
        while len(sent) >= WEIGHT_BATCHES_IN_FLIGHT:
            await sent.pop(0)
        call = self._ranks.call(context, "update_weights", frames=frames, tensors=metas)
        sent.append(asyncio.get_running_loop().create_task(call))

    async def FinishWeightUpdate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def finish() -> Any:
            need(request.version, "version", "the new weights' version, as GetWeightVersion will report it")
            await self._ranks.call(context, "finish_weight_update", version=request.version)
            return pb2.FinishWeightUpdateResponse(version=request.version)
        return await guard(context, finish())

    async def GetWeightVersion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def version() -> Any:
            versions = sorted({str(v) for v in await self._ranks.call(context, "weight_version")})
            if len(versions) > 1:
                raise Failed(grpc.StatusCode.FAILED_PRECONDITION,
                              f"the engine ranks serve different weight versions: {versions}")
            return pb2.GetWeightVersionResponse(version=versions[0])
        return await guard(context, version())


async def _tensors(messages: AsyncIterator[Any]) -> AsyncIterator[tuple[Any, bytes]]:
    """UpdateWeights' stream as whole tensors: each one's first message, and its bytes, joined when it came
    in pieces (Tensor.more: one message is at most the server's receive limit, a tensor can be larger)."""
    first: Any = None
    pieces: list[bytes] = []
    size = 0
    async for t in messages:
        if first is None:
            need(t.name, "name", "the parameter's name in the model's state dict")
            need(t.dtype, "dtype", "torch's name of its element type, e.g. bfloat16")
            first = t
        else:
            for field, value, want in (("name", t.name, first.name), ("dtype", t.dtype, first.dtype),
                                       ("shape", list(t.shape), list(first.shape))):
                if value and value != want:
                    raise Failed(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{field}: {value!r} in a piece of tensor {first.name!r}, whose first message "
                                 f"said {want!r}: a piece after the first carries only data (and more)")
        data = t.data  # protobuf makes a new bytes object at each read of the field
        pieces.append(data)
        size += len(data)
        if size > math.prod(first.shape) * MAX_ITEM_BYTES:  # the engine checks the exact size; this bounds memory
            raise Failed(grpc.StatusCode.INVALID_ARGUMENT, f"data: tensor {first.name!r} came with more than the "
                                                            f"{math.prod(first.shape) * MAX_ITEM_BYTES} bytes its "
                                                            f"shape {list(first.shape)} holds in any dtype")
        if not t.more:
            yield first, pieces[0] if len(pieces) == 1 else b"".join(pieces)
            first, pieces, size = None, [], 0
    if first is not None:
        raise Failed(grpc.StatusCode.INVALID_ARGUMENT, f"more: the stream ended inside tensor {first.name!r} "
                                                        f"({size} bytes came, its last piece "
                                                        "set `more`)")
