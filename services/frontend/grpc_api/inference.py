"""The Inference service: /inference/v1/generate's path with the HTTP layer swapped. The request
becomes the same JSON body and passes the same translation (checks, refusals, workers for long
prompts), placement and output processing (stop strings, text, logprobs) inside FrontendCore.launch;
only the writer differs. Runs on API server 0's event loop."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc

import tracing
from protocol.grpc import pb2, pb2_grpc
from protocol.logprobs import Segment
from services.frontend.engine_client.inflight import EngineFailure, InFlight
from services.frontend.errors import APIError
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.output import OutputProcessor
from services.frontend.grpc_api.pool_call import pool
from services.frontend.grpc_api.rpc import Failed, failed, guard, status_of
from services.frontend.grpc_api.stream_message import StreamMessage

ABORTED = "aborted by Control.Abort"


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


def _metadata(context: grpc.aio.ServicerContext) -> Any:
    """The call's metadata, where a `traceparent` may be; not read when tracing is off."""
    return (context.invocation_metadata() or ()) if tracing.enabled() else ()


async def next_pieces(outputs: OutputProcessor) -> list[Any]:
    """outputs.pieces(), with an end by Control.Abort as a finish ("abort"), not a failure."""
    try:
        return await outputs.pieces()
    except EngineFailure as exc:
        ended(outputs, exc)
        return []


def ended(outputs: OutputProcessor, exc: EngineFailure) -> None:
    """A stream's failure as its call's: Failed (raised), or a finish ("abort") when Control.Abort ended it."""
    if outputs.stream.gone != ABORTED:
        raise Failed(status_of(exc.status), str(exc)) from None
    outputs.finish = "abort"


class StreamMessages:
    """GenerateStream's messages, serialized, of one call: the ids (and text) of each pieces() call, the
    last with the finish, its reason and the usage. A plain step's message is encoded by hand
    (stream_message.py), the rest by protobuf."""

    __slots__ = ("_caller", "_encoder", "_outputs", "_rank", "_text_out")

    def __init__(self, engine_request: Any, outputs: OutputProcessor) -> None:
        self._caller, self._rank = engine_request.output.response_id, outputs.stream.rank
        self._text_out = engine_request.output.text_out
        self._outputs = outputs
        self._encoder = StreamMessage(self._caller, self._rank)

    def message(self, pieces: list[Any]) -> bytes | None:
        """The message of the latest pieces() call; None: nothing to say yet (text held back while a stop
        string may follow)."""
        outputs = self._outputs
        finish = outputs.finish
        if finish is None and outputs.formatter is None:
            if not outputs.token_ids:
                return None
            return self._encoder.encode(outputs.token_ids, _text(pieces) if self._text_out else "")
        resp = pb2.GenerateResponse(request_id=self._caller, token_ids=outputs.token_ids,
                                    data_parallel_rank=self._rank)
        if outputs.formatter is not None:
            resp.logprobs.extend(outputs.token_entries())
        if self._text_out:
            resp.text = _text(pieces)
        if finish is not None:
            _finish(resp, outputs, finish)
        elif not outputs.token_ids:
            return None
        return resp.SerializeToString()


def _text(pieces: list[Any]) -> str:
    return "".join(p if isinstance(p, str) else p.content for p in pieces)


class Inference(pb2_grpc.InferenceServicer):
    def __init__(self, core: FrontendCore) -> None:
        self._core = core
        self._running: dict[str, list[InFlight]] = defaultdict(list)  # caller's request id -> its streams

    # Generate and GenerateStream are served here only for a call the gRPC port relays: one it does
    # not serve itself (grpc_port.py), such as one with an unknown grpc-encoding.

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # The call's server span continues a `traceparent` sent in its metadata.
        with tracing.server_span("frontend.request", _metadata(context), {"rpc.method": "Generate"}):
            return await guard(context, self.generate(request))

    async def Embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await guard(context, pool(self._core, request, "embed", "Embed"))

    async def Classify(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await guard(context, pool(self._core, request, "classify", "Classify"))

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        with tracing.server_span("frontend.request", _metadata(context), {"rpc.method": "GenerateStream"}):
            try:
                engine_request = await self.translate(request, stream=True)
                with self.launched(engine_request) as outputs:
                    messages = StreamMessages(engine_request, outputs)
                    while outputs.finish is None:
                        message = messages.message(await next_pieces(outputs))
                        if message is not None:
                            yield message
            except Failed as exc:
                await context.abort(exc.code, str(exc))

    async def translate(self, raw: bytes, *, stream: bool) -> Any:
        """The serialized GenerateRequest through the token-in route's translation (parsed there: in a
        worker process when it is long). Its size is bounded already: the server's receive limit is
        --max-body-bytes (grpc_server.py)."""
        core = self._core
        if core.shutdown.draining:
            raise Failed(grpc.StatusCode.UNAVAILABLE, "the frontend is shutting down; send the request to another "
                                                       "replica")
        try:
            with tracing.span("frontend.translate"):
                return await core.translator.generate(raw, None, kind="grpc_stream" if stream else "grpc")
        except APIError as exc:
            raise failed(exc) from None

    async def generate(self, request: Any) -> Any:
        engine_request = await self.translate(request, stream=False)
        with self.launched(engine_request) as outputs:
            resp = pb2.GenerateResponse(request_id=engine_request.output.response_id,
                                        data_parallel_rank=outputs.stream.rank)
            text: list[str] = []
            while outputs.finish is None:
                pieces = await next_pieces(outputs)
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

    @contextlib.contextmanager
    def launched(self, engine_request: Any) -> Iterator[OutputProcessor]:
        """The request launched (FrontendCore.launch), registered for Control.Abort, its logprobs formatted
        for gRPC; on leaving (done, failed, or the call cancelled: a client that went away or a deadline),
        aborted at its engine if still running there."""
        with contextlib.ExitStack() as stack:
            try:
                prompts, streams, _ = stack.enter_context(self._core.launch([engine_request]))
            except APIError as exc:
                raise failed(exc) from None
            caller, stream = engine_request.output.response_id, streams[0]
            outputs: OutputProcessor = prompts[0][0]
            if outputs.formatter is not None:
                outputs.formatter = GrpcLogprobs(outputs.options.logprobs or 0)  # type: ignore[assignment]
            self._running[caller].append(stream)
            stack.callback(self._forget, caller, stream)
            yield outputs

    def _forget(self, caller: str, stream: InFlight) -> None:
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
                self._core.submitter.abort(stream)
            done.append(caller)
        return done
