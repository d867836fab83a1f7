"""The frontend's gRPC services (--grpc-port; protocol/grpc/fleet/v1/fleet.proto): token-in Inference,
Control, RlControl and KvEvents, with the standard health service and reflection, on API server 0's
event loop (grpc.aio) beside its HTTP server.

Inference is /inference/v1/generate's path with the HTTP layer swapped: the request becomes the same
JSON body and passes the same translation (checks, refusals, workers for long prompts), placement and
output processing (stop strings, text, logprobs); only the writer differs. Control and RlControl are the
engines' allowlisted utility calls, made on every ready rank at once; KvEvents relays the engines' KV
events (kv_relay.py). Auth: the HTTP API keys (--api-key), from `authorization: Bearer <key>` or
`x-api-key` metadata, compared in constant time; the health service needs none (probes send no keys).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from importlib import metadata
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from edge.api_keys import HOW_TO_SEND, ApiKeys, KeyCheck
from protocol import MAJOR, MINOR
from protocol.grpc import lock, pb2, pb2_grpc, service_names
from protocol.logprobs import Segment
from protocol.messages import UtilityResult
from services.frontend.app import Frontend
from services.frontend.errors import APIError
from services.frontend.kv_relay import KvRelay
from services.frontend.output import OutputProcessor
from services.frontend.stream import EngineFailure, Stream

log = logging.getLogger(__name__)

# A tensor of UpdateWeights travels in one message: the receive limit bounds the largest one.
MAX_MESSAGE_BYTES = 1 << 30
# UpdateWeights sends the engines a batch of tensors once this many bytes have come in (and at the end).
WEIGHT_BATCH_BYTES = 8 << 20
WEIGHT_BATCHES_IN_FLIGHT = 2
UTILITY_TIMEOUT_S = 60.0  # a utility call with no deadline of its own (the RPC's, when it has one, bounds it)

_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
           403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
           413: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
           503: grpc.StatusCode.UNAVAILABLE}
_MODES = {pb2.PAUSE_MODE_UNSPECIFIED: "keep", pb2.PAUSE_MODE_KEEP: "keep", pb2.PAUSE_MODE_ABORT: "abort",
          pb2.PAUSE_MODE_WAIT: "wait"}
_MODE_ENUM = {"keep": pb2.PAUSE_MODE_KEEP, "abort": pb2.PAUSE_MODE_ABORT, "wait": pb2.PAUSE_MODE_WAIT}
ABORTED = "aborted by Control.Abort"


class _Failed(Exception):
    """An RPC's error: its status code and message (the handler aborts the call with them)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _status(http_status: int) -> grpc.StatusCode:
    return _STATUS.get(http_status, grpc.StatusCode.INTERNAL)


def _failed(exc: APIError) -> _Failed:
    """An HTTP-side refusal as the call's status; its message names the field (HTTP gives it apart)."""
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    return _Failed(_status(exc.status), message)


# ---- Inference -------------------------------------------------------------------------------------

class GrpcLogprobs:
    """The output processor's logprobs formatter for gRPC (OutputProcessor.formatter's port): each
    token's entry as a TokenLogprob message, its alternatives the k most likely in rank order."""

    __slots__ = ("top",)

    def __init__(self, top: int) -> None:
        self.top = top

    def sampled(self, seg: Segment) -> list[Any]:
        return rows(seg, 0, seg.positions, self.top)

    def prompt(self, segments: Sequence[Segment], prompt_ids: Sequence[int]) -> list[Any]:  # no echo here
        return []


def rows(seg: Segment, start: int, stop: int, top: int) -> list[Any]:
    ids, lps, ranks, w = seg.token_ids, seg.logprobs, seg.ranks, seg.k + 1
    k = min(top, seg.k)
    out = []
    for i in range(start, stop):
        row = i * w
        alternatives = [pb2.TopLogprob(token_id=ids[row + j], logprob=lps[row + j]) for j in range(1, k + 1)]
        out.append(pb2.TokenLogprob(token_id=ids[row], logprob=lps[row], rank=max(ranks[i], 0),
                                    top_logprobs=alternatives))
    return out


def _finish(resp: Any, outputs: OutputProcessor, finish: str) -> None:
    resp.finish_reason = finish
    stop = outputs.stop_reason
    if isinstance(stop, str):
        resp.stop_string = stop
    elif isinstance(stop, int):
        resp.stop_token_id = stop
    resp.usage.CopyFrom(pb2.Usage(prompt_tokens=outputs.stream.prompt_len,
                                  completion_tokens=outputs.completion_tokens, cached_tokens=outputs.cached_tokens))


async def _pieces(outputs: OutputProcessor) -> list[Any]:
    """outputs.pieces(), with an end by Control.Abort as a finish ("abort"), not a failure."""
    try:
        return await outputs.pieces()
    except EngineFailure as exc:
        if outputs.stream.gone != ABORTED:
            raise _Failed(_status(exc.status), str(exc)) from None
        outputs.finish = "abort"
        return []


class Inference(pb2_grpc.InferenceServicer):
    def __init__(self, app: Frontend) -> None:
        self._app = app
        self._running: dict[str, list[Stream]] = defaultdict(list)  # caller's request id -> its streams

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await _guard(context, self._generate(request))

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for resp in self._generate_stream(request):
                yield resp
        except _Failed as exc:
            await context.abort(exc.code, str(exc))

    async def _translate(self, raw: bytes, *, stream: bool) -> Any:
        """The serialized GenerateRequest through the token-in route's translation (parsed there: in a
        worker process when it is long)."""
        app = self._app
        if app.shutdown.draining:
            raise _Failed(grpc.StatusCode.UNAVAILABLE, "the frontend is shutting down; send the request to another "
                                                       "replica")
        limit = app.config.max_body_bytes
        if len(raw) > limit:  # HTTP's 413 (the 1 GiB message limit is for UpdateWeights' tensors)
            raise _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"token_ids: the request is {len(raw)} bytes, more than "
                                                            f"the server's --max-body-bytes ({limit})")
        try:
            return await app.translator.generate(raw, None, kind="grpc_stream" if stream else "grpc")
        except APIError as exc:
            raise _failed(exc) from None

    async def _generate(self, request: Any) -> Any:
        engine_request = await self._translate(request, stream=False)
        with self._launched(engine_request) as outputs:
            resp = pb2.GenerateResponse(request_id=engine_request.output.response_id,
                                        data_parallel_rank=outputs.stream.rank)
            text: list[str] = []
            while outputs.finish is None:
                pieces = await _pieces(outputs)
                resp.token_ids.extend(outputs.token_ids)
                if outputs.formatter is not None:
                    resp.logprobs.extend(outputs.token_entries())
                if engine_request.output.text_out:
                    text.extend(p if isinstance(p, str) else p.content for p in pieces)
            resp.text = "".join(text)
            _finish(resp, outputs, outputs.finish)
            if outputs.options.prompt_logprobs is not None:
                top = outputs.options.prompt_logprobs
                for seg in outputs.prompt_segments:
                    resp.prompt_logprobs.extend(rows(seg, 0, seg.positions, top))
            return resp

    async def _generate_stream(self, request: Any) -> AsyncIterator[Any]:
        engine_request = await self._translate(request, stream=True)
        with self._launched(engine_request) as outputs:
            caller = engine_request.output.response_id
            rank, text_out = outputs.stream.rank, engine_request.output.text_out
            while outputs.finish is None:
                pieces = await _pieces(outputs)
                resp = pb2.GenerateResponse(request_id=caller, token_ids=outputs.token_ids, data_parallel_rank=rank)
                if outputs.formatter is not None:
                    resp.logprobs.extend(outputs.token_entries())
                if text_out:
                    resp.text = "".join(p if isinstance(p, str) else p.content for p in pieces)
                if outputs.finish is not None:
                    _finish(resp, outputs, outputs.finish)
                elif not outputs.token_ids:
                    continue  # text held back (a stop string may follow): nothing to say yet
                yield resp

    @contextlib.contextmanager
    def _launched(self, engine_request: Any) -> Iterator[OutputProcessor]:
        """The request launched (Frontend.launch), registered for Control.Abort, its logprobs formatted
        for gRPC; on leaving (done, failed, or the call cancelled: a client that went away or a deadline),
        aborted at its engine if still running there."""
        with contextlib.ExitStack() as stack:
            try:
                prompts, streams, _ = stack.enter_context(self._app.launch([engine_request]))
            except APIError as exc:
                raise _failed(exc) from None
            caller, stream = engine_request.output.response_id, streams[0]
            outputs: OutputProcessor = prompts[0][0]
            if outputs.formatter is not None:
                outputs.formatter = GrpcLogprobs(outputs.options.logprobs or 0)  # type: ignore[assignment]
            self._running[caller].append(stream)
            stack.callback(self._forget, caller, stream)
            yield outputs

    def _forget(self, caller: str, stream: Stream) -> None:
        running = self._running[caller]
        running.remove(stream)
        if not running:
            del self._running[caller]

    def abort(self, caller_ids: Sequence[str]) -> list[str]:
        """Control.Abort: end these requests' streams here and at their engines."""
        done = []
        for caller in caller_ids:
            streams = self._running.get(caller)
            if not streams:
                continue
            for stream in streams:
                stream.fail(ABORTED)
                self._app.dispatcher.abort(stream)
            done.append(caller)
        return done


# ---- Control and RlControl: utility calls on every ready rank ------------------------------------


class _Ranks:
    """Utility calls on every ready rank at once; an error names each rank that failed and why."""

    def __init__(self, app: Frontend) -> None:
        self._app = app

    def ready(self) -> list[int]:
        ranks = [e.index for e in self._app.engines.engines if e.state == "ready"]
        if not ranks:
            raise _Failed(grpc.StatusCode.UNAVAILABLE, f"no engine rank is ready: {self._app.engines.not_ready()}")
        return ranks

    async def call(self, context: grpc.aio.ServicerContext, utility: str, frames: Sequence[bytes] = (),
                   **args: Any) -> list[Any]:
        indexes = self.ready()
        left = context.time_remaining()
        timeout = UTILITY_TIMEOUT_S if left is None else max(left, 0.001)
        engines = self._app.engines
        try:
            results: list[UtilityResult] = await asyncio.gather(
                *(engines.utility(i, utility, args, timeout, frames) for i in indexes))
        except TimeoutError:
            raise _Failed(grpc.StatusCode.DEADLINE_EXCEEDED, f"{utility}: the engines did not answer within "
                                                              f"{timeout:.1f}s") from None
        failed = [(engines.engines[i].rank, r.error or "failed") for i, r in zip(indexes, results, strict=True)
                  if not r.ok]
        if failed:
            unsupported = all("Unsupported" in why for _, why in failed)
            message = "; ".join(f"engine rank {rank}: {why}" for rank, why in failed)
            raise _Failed(grpc.StatusCode.UNIMPLEMENTED if unsupported else grpc.StatusCode.FAILED_PRECONDITION,
                          f"{utility}: {message}")
        return [r.result for r in results]


def _sha256(path: Any) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


class Control(pb2_grpc.ControlServicer):
    def __init__(self, app: Frontend, inference: Inference, started_at: float) -> None:
        self._app, self._inference, self._ranks = app, inference, _Ranks(app)
        self._started_at = started_at
        self._tokenizer_sha = _sha256(app.model.path / "tokenizer.json")
        self._schema = f"{lock.describe()['package']}:{lock.fingerprint(lock.merged(None, lock.describe()))}"

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        app = self._app
        return pb2.GetServerInfoResponse(
            server_version=_version(), frontend_id=app.engines.frontend_id, protocol_major=MAJOR,
            protocol_minor=MINOR, data_parallel_size=len(app.engines.engines),
            ready_ranks=[e.rank for e in app.engines.engines if e.state == "ready"], started_at=self._started_at,
            grpc_schema=self._schema)

    async def GetModelInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def info() -> Any:
            app = self._app
            ready = [e.ready for e in app.engines.engines if e.ready is not None]
            if not ready:
                raise _Failed(grpc.StatusCode.UNAVAILABLE, f"no engine has handshaken yet: {app.engines.not_ready()}")
            model = app.model
            return pb2.GetModelInfoResponse(
                served_model_name=model.name, model_path=str(model.path),
                max_model_len=min(r.max_model_len for r in ready),
                vocab_size=model.tokenizer.get_vocab_size(with_added_tokens=True), block_size=ready[0].block_size,
                eos_token_ids=[] if model.eos_token_id is None else [model.eos_token_id],
                tokenizer_sha256=self._tokenizer_sha, chat_template_sha256=model.template.sha256,
                backend=ready[0].backend)
        return await _guard(context, info())

    async def GetLoads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ranks = []
        for e in self._app.engines.engines:
            s = e.stats
            load = pb2.RankLoad(rank=e.rank, state=e.state, in_flight=len(e.inflight), epoch=e.epoch)
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
            _need(request.name, "name", "the adapter's name, as requests will send it in lora_name")
            _need(request.path, "path", "a directory on the engines' hosts with adapter_config.json")
            try:  # as /v1/load_lora_adapter: on every ready rank or none; HTTP requests may name it as their model
                await self._app.adapters.load(request.name, request.path)
            except APIError as exc:
                raise _failed(exc) from None
            return pb2.LoadLoraResponse()
        return await _guard(context, load())

    async def UnloadLora(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def unload() -> Any:
            _need(request.name, "name", "a loaded adapter's name")
            try:
                await self._app.adapters.unload(request.name)
            except APIError as exc:
                raise _failed(exc) from None
            return pb2.UnloadLoraResponse()
        return await _guard(context, unload())

    async def ListLoras(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def names() -> Any:
            results = await self._ranks.call(context, "list_loras")
            # An adapter is served when every rank has it (a request may be placed on any).
            common = set(results[0] or ())
            for r in results[1:]:
                common &= set(r or ())
            return pb2.ListLorasResponse(names=sorted(common))
        return await _guard(context, names())

    async def ResetPrefixCache(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def reset() -> Any:
            indexes = self._ranks.ready()
            results = await self._ranks.call(context, "reset_prefix_cache")
            engines = self._app.engines.engines
            return pb2.ResetPrefixCacheResponse(reset_ranks=[engines[i].rank for i, ok in zip(indexes, results,
                                                                                              strict=False) if ok])
        return await _guard(context, reset())


def _need(value: str, field: str, what: str) -> None:
    if not value:
        raise _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: must be set ({what})")


class RlControl(pb2_grpc.RlControlServicer):
    """Pause and resume, sleep and wake, and weight updates, on every ready rank. A weight update is
    StartWeightUpdate, UpdateWeights (tensors streamed in; sent on to the engines in batches of about
    WEIGHT_BATCH_BYTES as raw frames), FinishWeightUpdate (the new weights serve from then on)."""

    def __init__(self, app: Frontend) -> None:
        self._ranks = _Ranks(app)

    async def PauseGeneration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def pause() -> Any:
            mode = _MODES.get(request.mode)
            if mode is None:
                raise _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"mode={request.mode} is not a PauseMode: allowed "
                                                                "PAUSE_MODE_KEEP, PAUSE_MODE_ABORT, PAUSE_MODE_WAIT")
            results = await self._ranks.call(context, "pause", mode=mode)
            return pb2.PauseGenerationResponse(aborted=sum(int((r or {}).get("aborted", 0)) for r in results))
        return await _guard(context, pause())

    async def ResumeGeneration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def resume() -> Any:
            await self._ranks.call(context, "resume")
            return pb2.ResumeGenerationResponse()
        return await _guard(context, resume())

    async def IsPaused(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def paused() -> Any:
            results = [r or {} for r in await self._ranks.call(context, "is_paused")]
            mode = next((r.get("mode") for r in results if r.get("paused")), None)
            return pb2.IsPausedResponse(paused=any(r.get("paused") for r in results),
                                        mode=_MODE_ENUM.get(mode or "", pb2.PAUSE_MODE_UNSPECIFIED),
                                        held=sum(int(r.get("held", 0)) for r in results))
        return await _guard(context, paused())

    async def Sleep(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def sleep() -> Any:
            level = request.level or 1
            if level not in (1, 2):
                raise _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"level={level} is out of range: allowed 1 or 2")
            await self._ranks.call(context, "sleep", level=level)
            return pb2.SleepResponse()
        return await _guard(context, sleep())

    async def WakeUp(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def wake() -> Any:
            await self._ranks.call(context, "wake_up")
            return pb2.WakeUpResponse()
        return await _guard(context, wake())

    async def IsSleeping(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def sleeping() -> Any:
            return pb2.IsSleepingResponse(sleeping=any(await self._ranks.call(context, "is_sleeping")))
        return await _guard(context, sleeping())

    async def StartWeightUpdate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def start() -> Any:
            await self._ranks.call(context, "start_weight_update")
            return pb2.StartWeightUpdateResponse()
        return await _guard(context, start())

    async def UpdateWeights(self, request_iterator: AsyncIterator[Any],
                            context: grpc.aio.ServicerContext) -> Any:
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
                async for t in request_iterator:
                    _need(t.name, "name", "the parameter's name in the model's state dict")
                    _need(t.dtype, "dtype", "torch's name of its element type, e.g. bfloat16")
                    data = t.data
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
        return await _guard(context, update())

    async def _send(self, context: grpc.aio.ServicerContext, sent: list[asyncio.Task[list[Any]]],
                    metas: list[dict[str, Any]], frames: list[bytes]) -> None:
        """One batch on its way to every rank; waits while WEIGHT_BATCHES_IN_FLIGHT are (and raises the
        first one's failure)."""
        while len(sent) >= WEIGHT_BATCHES_IN_FLIGHT:
            await sent.pop(0)
        call = self._ranks.call(context, "update_weights", frames=frames, tensors=metas)
        sent.append(asyncio.get_running_loop().create_task(call))

    async def FinishWeightUpdate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def finish() -> Any:
            _need(request.version, "version", "the new weights' version, as GetWeightVersion will report it")
            await self._ranks.call(context, "finish_weight_update", version=request.version)
            return pb2.FinishWeightUpdateResponse(version=request.version)
        return await _guard(context, finish())

    async def GetWeightVersion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def version() -> Any:
            versions = sorted({str(v) for v in await self._ranks.call(context, "weight_version")})
            if len(versions) > 1:
                raise _Failed(grpc.StatusCode.FAILED_PRECONDITION,
                              f"the engine ranks serve different weight versions: {versions}")
            return pb2.GetWeightVersionResponse(version=versions[0])
        return await _guard(context, version())


# ---- KvEvents --------------------------------------------------------------------------------------


class KvEvents(pb2_grpc.KvEventsServicer):
    def __init__(self, relay: KvRelay) -> None:
        self._relay = relay

    async def Subscribe(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for event in self._relay.subscribe(request.after_seq, request.relay_epoch):
            yield event


# ---- the server ------------------------------------------------------------------------------------


async def _guard(context: grpc.aio.ServicerContext, work: Awaitable[Any]) -> Any:
    """A unary handler's body: its _Failed as the call's status."""
    try:
        return await work
    except _Failed as exc:
        await context.abort(exc.code, str(exc))


def _version() -> str:
    try:
        return metadata.version("fleet")
    except metadata.PackageNotFoundError:
        return "unknown"


_OPEN = ("/grpc.health.v1.Health/",)


class _Auth(grpc.aio.ServerInterceptor):
    """Every method but the health service's needs one of the API keys (constant-time compare)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = ApiKeys(keys)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        if (details.method.startswith(_OPEN)
                or self._keys.check(details.invocation_metadata or ()) is KeyCheck.ACCEPTED):
            return await continuation(details)
        return _refusal(details.method)


def _refusal(method: str) -> Any:
    """A handler that refuses the call: UNAUTHENTICATED, of the method's own kind."""
    message = f"a valid API key is required: {HOW_TO_SEND} metadata"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover

    if method.endswith(("/GenerateStream", "/Subscribe")):
        return grpc.unary_stream_rpc_method_handler(streaming)
    if method.endswith("/UpdateWeights"):
        return grpc.stream_unary_rpc_method_handler(unary)
    return grpc.unary_unary_rpc_method_handler(unary)


class GrpcServer:
    """The gRPC services on this process's loop. start() binds (raises OSError when the port cannot be
    had), stop(grace) ends it: running calls get `grace` seconds."""

    def __init__(self, app: Frontend, relay: KvRelay, *, host: str, port: int, api_keys: Sequence[str]) -> None:
        self.app, self.relay = app, relay
        self._host, self._port = host, port
        interceptors = [_Auth(api_keys)] if api_keys else []
        self.server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0)])
        self.inference = Inference(app)
        # Inference's requests reach the handlers serialized: translation parses them where it would parse
        # an HTTP body (in a worker process when long), not the event loop.
        out = pb2.GenerateResponse.SerializeToString
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fleet.v1.Inference", {
            "Generate": grpc.unary_unary_rpc_method_handler(self.inference.Generate, response_serializer=out),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(self.inference.GenerateStream,
                                                                    response_serializer=out)}),))
        pb2_grpc.add_ControlServicer_to_server(Control(app, self.inference, time.time()), self.server)
        pb2_grpc.add_RlControlServicer_to_server(RlControl(app), self.server)
        pb2_grpc.add_KvEventsServicer_to_server(KvEvents(relay), self.server)
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection([*service_names(), health_name, reflection.SERVICE_NAME], self.server)
        self.port = 0

    async def start(self) -> None:
        address = f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"--grpc-port {self._port}: cannot listen on {address}: {exc}") from None
        if not self.port:
            raise OSError(f"--grpc-port {self._port}: cannot listen on {address}")
        await self.server.start()
        await self.set_serving(self.app.engines.all_ready())
        log.info("gRPC serving %s:%d (%s; health, reflection)", self._host, self.port,
                 ", ".join(s.rsplit(".", 1)[1] for s in service_names()))

    async def set_serving(self, serving: bool) -> None:
        """The health service's answer, overall and per service: SERVING once every engine is ready."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *service_names()):
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
