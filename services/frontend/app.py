"""The frontend's ASGI app, one per API server process. The two generation routes are served by a lean
ASGI handler (no middleware send wrappers, one body send per batch of queued events, disconnects
watched directly) that runs the stages in turn; starlette routes everything else.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services.frontend import openapi, responses
from services.frontend.asgi import (
    ClientGone,
    header,
    read_body,
    send_json,
    watch_disconnect,
)
from services.frontend.config import FrontendConfig
from services.frontend.dispatcher import Dispatcher
from services.frontend.engines import EngineSet
from services.frontend.errors import APIError, error_body
from services.frontend.metrics import Metrics
from services.frontend.model import Model
from services.frontend.output import OutputProcessor
from services.frontend.parsers import OutputParser, TokenOutputParser, build_parser
from services.frontend.parsers.forced import NamedToolParser, RequiredToolParser
from services.frontend.placement import NoEngine, Placement
from services.frontend.response_writer import send_completion, send_stream
from services.frontend.shutdown import Shutdown
from services.frontend.stream import Stream
from services.frontend.translation import PIN_HEADER, EngineRequest, Translator


class Frontend:
    def __init__(self, config: FrontendConfig, model: Model, engines: EngineSet, metrics: Metrics) -> None:
        self.config = config
        self.model = model
        self.engines = engines
        self.metrics = metrics
        self.placement = Placement()
        self.dispatcher = Dispatcher(engines, self.placement)
        self.shutdown = Shutdown()
        self.translator = Translator(model, self._max_model_len, long_prompt_chars=config.long_prompt_chars,
                                     max_concurrent_tokenizations=config.max_concurrent_tokenizations,
                                     enable_auto_tool_choice=config.enable_auto_tool_choice,
                                     tool_call_parser=config.tool_call_parser, reasoning_parser=config.reasoning_parser,
                                     engine_problem=self._engine_problem)
        self._created = int(time.time())
        self._openapi = msgspec.json.encode(openapi.document(model.name))
        self._lean: dict[str, Callable[[bytes, bytes | None], Awaitable[EngineRequest]]] = {
            "/v1/chat/completions": self.translator.chat, "/v1/completions": self.translator.completion}
        self.starlette = Starlette(routes=[
            Route("/health", self._health), Route("/ready", self._ready),
            Route("/v1/models", self._models), Route("/metrics", self._metrics),
            Route("/openapi.json", self._openapi_json)],
            exception_handlers={404: _http_error, 405: _http_error})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        translate = self._lean.get(scope["path"]) if scope["type"] == "http" else None
        if translate is None:
            await self.starlette(scope, receive, send)
            return
        if scope["method"] != "POST":
            await send_json(send, 405, error_body(405, f"{scope['path']} accepts POST only"), [(b"allow", b"POST")])
            return
        if self.shutdown.draining:
            # connection: close, so a client's next request opens a connection to another replica.
            await send_json(send, 503, error_body(503, "the frontend is shutting down; send the request to "
                                                       "another replica"), [(b"connection", b"close")])
            return
        with self.shutdown.handling():
            try:
                body = await read_body(scope, receive, self.config.max_body_bytes)
                request = await translate(body, header(scope, b"x-data-parallel-rank"))
                await self._generate(request, receive, send)
            except APIError as exc:
                await send_json(send, exc.status, exc.body())
            except ClientGone:
                pass

    # ---- plain routes (starlette) ----

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _ready(self, request: Request) -> Response:
        if self.shutdown.draining:
            return JSONResponse({"ready": False, "draining": True}, 503)
        missing = self.engines.not_ready()
        self.metrics.engines_ready.set(len(self.engines.engines) - len(missing))
        if missing:
            return JSONResponse({"ready": False, "missing": {str(k): v for k, v in missing.items()}}, 503)
        return JSONResponse({"ready": True, "ranks": [e.rank for e in self.engines.engines]})

    async def _models(self, request: Request) -> Response:
        return Response(responses.models(self.model.name, self._max_model_len(or_zero=True), self._created),
                        media_type="application/json")

    async def _openapi_json(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        m, name = self.metrics, self.model.name
        for engine in self.engines.engines:
            rank = str(engine.rank)
            m.engine_streams.labels(name, rank).set(len(engine.inflight))
            stats = engine.stats
            m.engine_running.labels(name, rank).set(stats.running if stats is not None else 0)
            m.engine_waiting.labels(name, rank).set(stats.waiting if stats is not None else 0)
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    # ---- generation (lean ASGI) ----

    async def _generate(self, request: EngineRequest, receive: Receive, send: Send) -> None:
        """Placement, then output processing into the writers, until the response is sent."""
        if self.shutdown.cut is not None:  # its body or tokens arrived after the shutdown deadline
            raise APIError(503, self.shutdown.cut)
        stream = Stream(request.request_id, request.prompt_len, request.max_tokens)
        try:
            engine = self.dispatcher.choose(request)
        except NoEngine as exc:
            raise APIError(exc.status, str(exc), param=PIN_HEADER if exc.status == 400 else None) from None
        options = request.output
        parser: OutputParser | TokenOutputParser | None = None
        # A forced tool_choice's output is structured from its first token: no reasoning to split off.
        if isinstance(options.tool_choice, dict):
            parser = NamedToolParser(options.tool_choice["function"]["name"])
        elif options.tool_choice == "required":
            parser = RequiredToolParser()
        elif options.tool_parser is not None or options.reasoning_parser is not None:
            parser = build_parser(options.tool_parser, options.reasoning_parser, tools=list(options.tools),
                                  prompt=options.prompt_tail)
        outputs = OutputProcessor(stream, request, tokenizer=self.model.tokenizer, engines=self.dispatcher,
                                  metrics=self.metrics, parser=parser)
        self.dispatcher.submit(engine, stream, request)
        self.metrics.running.inc()
        self.metrics.prompt_tokens.inc(request.prompt_len)
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, stream.fail))
        try:
            with self.shutdown.running(stream):
                if request.output.stream:
                    await send_stream(send, outputs, self.model.name)
                else:
                    await send_completion(send, outputs, self.model.name)
        finally:
            watcher.cancel()
            self.dispatcher.abort(stream)  # a no-op unless it is still running at its engine
            self.metrics.running.dec()

    def _engine_problem(self, minor: int) -> str | None:
        """Why some ready engine cannot honour what only the vllm backend does (structured output,
        logits controls) and protocol 1.<minor> carries (an older engine would drop the fields unread), or None."""
        for engine in self.engines.engines:
            ready = engine.ready
            if ready is not None and (ready.backend != "vllm" or (ready.major, ready.minor) < (1, minor)):
                return (f"engine rank {engine.rank} cannot (its {ready.backend} backend, protocol "
                        f"{ready.major}.{ready.minor}; the vllm backend with protocol 1.{minor} or newer can)")
        return None

    def _max_model_len(self, *, or_zero: bool = False) -> int:
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if not lens:
            if or_zero:
                return 0
            raise APIError(503, "no engine has handshaken yet: " + str(self.engines.not_ready()))
        return min(lens)


async def _http_error(request: Request, exc: Exception) -> Response:
    """starlette's 404 (no route) and 405 (a route's other method) in the OpenAI error shape, which
    clients parse, rather than its plain text; a 405 keeps the Allow header starlette sets."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(sorted(headers.get("Allow", "").split(", ")))  # starlette's is a set's order
        message = f"{request.url.path} accepts {headers['Allow']} only"
    else:
        message = f"no route for {request.method} {request.url.path}"
    return Response(error_body(exc.status_code, message), exc.status_code, headers=headers,
                    media_type="application/json")
