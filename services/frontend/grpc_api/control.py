"""The Control service: server and model info, the ranks' loads, Control.Abort, LoRA adapters, and the
prefix caches' reset, as the engines' allowlisted utility calls on every ready rank. Runs on API
server 0's event loop."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from protocol import MAJOR, MINOR
from protocol.grpc import lock, pb2, pb2_grpc
from services.frontend.errors import APIError
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.grpc_api.inference import Inference
from services.frontend.grpc_api.rpc import Failed, Ranks, failed, guard, need


class Control(pb2_grpc.ControlServicer):
    def __init__(self, core: FrontendCore, inference: Inference, started_at: float,
                 others_in_flight: Callable[[int], int] = lambda index: 0) -> None:
        """`others_in_flight(i)`: the other API servers' requests on rank index i (in_flight.py)."""
        self._core, self._inference, self._ranks = core, inference, Ranks(core)
        self._others_in_flight = others_in_flight
        self._started_at = started_at
        self._schema = f"{lock.describe()['package']}:{lock.fingerprint(lock.merged(None, lock.describe()))}"

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core = self._core
        return pb2.GetServerInfoResponse(
            server_version=self._core.version, frontend_id=core.engines.frontend_id, protocol_major=MAJOR,
            protocol_minor=MINOR, data_parallel_size=len(core.engines.engines),
            ready_ranks=core.engines.serving(), started_at=self._started_at,
            grpc_schema=self._schema, max_message_bytes=core.config.max_body_bytes)

    async def GetModelInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def info() -> Any:
            core = self._core
            ready = [e.ready for e in core.engines.engines if e.ready is not None]
            if not ready:
                raise Failed(grpc.StatusCode.UNAVAILABLE, f"no engine has handshaken yet: {core.engines.not_ready()}")
            model = core.model
            return pb2.GetModelInfoResponse(
                served_model_name=model.name, model_path=str(model.path),
                max_model_len=min(r.max_model_len for r in ready),
                vocab_size=model.tokenizer.get_vocab_size(with_added_tokens=True), block_size=ready[0].block_size,
                eos_token_ids=[] if model.eos_token_id is None else [model.eos_token_id],
                tokenizer_sha256=model.tokenizer_sha256,
                chat_template_sha256=model.template.sha256 if model.template else "",
                backend=ready[0].backend)
        return await guard(context, info())

    async def GetLoads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ranks = []
        for i, e in enumerate(self._core.engines.engines):
            s = e.stats
            state = e.condition.split(":", 1)[0]  # a ready rank that takes no new requests says why: slow, ...
            load = pb2.RankLoad(rank=e.rank, state=state, in_flight=len(e.inflight) + self._others_in_flight(i),
                                epoch=e.epoch)
            if s is not None and e.state == "ready":
                load.running, load.waiting, load.kv_usage = s.running, s.waiting, s.kv_usage
                load.num_kv_blocks = s.num_kv_blocks
                load.prefix_cache_queries, load.prefix_cache_hits = s.prefix_cache_queries, s.prefix_cache_hits
            ranks.append(load)
        return pb2.GetLoadsResponse(ranks=ranks)

    async def Abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb2.AbortResponse(aborted=self._inference.abort(list(request.request_ids)))

    async def LoadLora(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def load() -> Any:
            need(request.name, "name", "the adapter's name, as requests will send it in lora_name")
            need(request.path, "path", "a directory on the engines' hosts with adapter_config.json")
            try:  # as /v1/load_lora_adapter: on every ready rank or none; HTTP requests may name it as their model
                await self._core.lora.load(request.name, request.path)
            except APIError as exc:
                raise failed(exc) from None
            return pb2.LoadLoraResponse()
        return await guard(context, load())

    async def UnloadLora(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def unload() -> Any:
            need(request.name, "name", "a loaded adapter's name")
            try:
                await self._core.lora.unload(request.name)
            except APIError as exc:
                raise failed(exc) from None
            return pb2.UnloadLoraResponse()
        return await guard(context, unload())

    async def ListLoras(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def names() -> Any:
            results = await self._ranks.call(context, "list_loras")
            # An adapter is served when every rank has it (a request may be placed on any).
            common = set(results[0] or ())
            for r in results[1:]:
                common &= set(r or ())
            return pb2.ListLorasResponse(names=sorted(common))
        return await guard(context, names())

    async def ResetPrefixCache(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def reset() -> Any:
            indexes = self._ranks.ready()
            results = await self._ranks.call(context, "reset_prefix_cache")
            engines = self._core.engines.engines
            return pb2.ResetPrefixCacheResponse(reset_ranks=[engines[i].rank for i, ok in zip(indexes, results,
                                                                                              strict=False) if ok])
        return await guard(context, reset())
