"""The frontend's ASGI app, one per API server process. The generation routes (chat, completions, and
token-in /inference/v1/generate) are served by a lean ASGI handler (no middleware send wrappers, one
body send per batch of queued events, disconnects watched directly) that runs the stages in turn; the
preprocessing routes (render, tokenize, detokenize: JSON in, JSON out, no engine) by a plain one;
starlette routes everything else. In render-only mode (--render-only) there are no engines and the
generation routes are not served.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from edge.api_keys import HOW_TO_SEND, ApiKeys, KeyCheck
from services.frontend import openapi, render, responses
from services.frontend.adapters import Adapters, LoadLoraBody, UnloadLoraBody
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
from services.frontend.metrics import EngineView, Metrics
from services.frontend.model import Model
from services.frontend.output import OutputProcessor
from services.frontend.parsers import OutputParser, TokenOutputParser, build_parser
from services.frontend.parsers.forced import NamedToolParser, RequiredToolParser
from services.frontend.placement import NoEngine, Placement
from services.frontend.response_writer import send_completion, send_stream, send_tokens
from services.frontend.schema import parse
from services.frontend.shutdown import Shutdown
from services.frontend.stream import Stream, Wakeup
from services.frontend.translation import PIN_HEADER, EngineRequest, OutputOptions, Translator

# The routes --api-key guards (vLLM's: everything under /v1, and the token-in, render and tokenize routes);
# /health, /ready, /metrics, /version and /openapi.json stay open for probes and scrapers.
_GUARDED = ("/v1/", "/inference/", "/tokenize", "/detokenize")


class Frontend:
    def __init__(self, config: FrontendConfig, model: Model, engines: EngineSet, metrics: Metrics) -> None:
        self.config = config
        self.model = model
        self.engines = engines
        self.metrics = metrics
        metrics.watch_engines(self._engine_views)
        self.placement = Placement()
        self.dispatcher = Dispatcher(engines, self.placement)
        self.adapters = Adapters(engines, model.name)
        self.shutdown = Shutdown()
        self.translator = Translator(model, self._max_model_len, long_prompt_chars=config.long_prompt_chars,
                                     max_concurrent_tokenizations=config.max_concurrent_tokenizations,
                                     enable_auto_tool_choice=config.enable_auto_tool_choice,
                                     tool_call_parser=config.tool_call_parser, reasoning_parser=config.reasoning_parser,
                                     engine_problem=self._engine_problem, max_logprobs=config.max_logprobs,
                                     render_max_model_len=self._context_len,
                                     max_choices=config.max_request_choices,
                                     stream_interval=config.stream_interval,
                                     # render-only: no engines, so no adapters (a name not the model's is a 404)
                                     check_adapter=None if config.render_only else self.adapters.check)
        self._created = int(time.time())
        self._keys = ApiKeys(config.api_keys)
        self._openapi = msgspec.json.encode(openapi.document(model.name, render_only=config.render_only,
                                                             max_logprobs=config.max_logprobs))
        self._openapi_adapters: tuple[str, ...] = ()  # the adapters self._openapi names
        self._lean: dict[str, Callable[[bytes, bytes | None], Awaitable[EngineRequest | list[EngineRequest]]]] = {
            "/v1/chat/completions": self.translator.chat, "/v1/completions": self.translator.completion,
            "/inference/v1/generate": self.translator.generate}
        # JSON in, JSON out, no engine: served in render-only mode too.
        self._preprocess: dict[str, Callable[[bytes], Awaitable[bytes]]] = {
            "/tokenize": self._tokenize, "/detokenize": self.translator.detokenize,
            "/v1/chat/completions/render": self._render_chat, "/v1/completions/render": self._render_completion}
        self.starlette = Starlette(routes=[
            Route("/health", self._health), Route("/ready", self._ready),
            Route("/v1/models", self._models), Route("/metrics", self._metrics),
            Route("/openapi.json", self._openapi_json), Route("/version", self._version),
            Route("/v1/load_lora_adapter", self._load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", self._unload_lora, methods=["POST"])],
            exception_handlers={404: _http_error, 405: _http_error, APIError: _api_error})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else None
        if (self._keys and path is not None and path.startswith(_GUARDED)
                and self._keys.check(scope["headers"]) is not KeyCheck.ACCEPTED):
            await send_json(send, 401, error_body(401, f"a valid API key is required: {HOW_TO_SEND}"),
                            [(b"www-authenticate", b"Bearer")])
            return
        translate = self._lean.get(path) if path is not None else None
        preprocess = self._preprocess.get(path) if path is not None else None
        if translate is None and preprocess is None:
            await self.starlette(scope, receive, send)
            return
        if translate is not None and self.config.render_only:
            # As vLLM's render server, which has no generation routes: a 404, saying where to go instead.
            await send_json(send, 404, error_body(404, f"{path} is not served: this frontend runs with --render-only "
                                                       "(no engines); POST the request to its /render route here and "
                                                       "the tokens to /inference/v1/generate on a frontend with "
                                                       "engines"))
            return
        if scope["method"] != "POST":
            await send_json(send, 405, error_body(405, f"{path} accepts POST only"), [(b"allow", b"POST")])
            return
        if self.shutdown.draining:
            # connection: close, so a client's next request opens a connection to another replica.
            await send_json(send, 503, error_body(503, "the frontend is shutting down; send the request to "
                                                       "another replica"), [(b"connection", b"close")])
            return
        with self.shutdown.handling():
            try:
                body = await read_body(scope, receive, self.config.max_body_bytes)
                if preprocess is not None:
                    await send_json(send, 200, await preprocess(body))
                    return
                assert translate is not None
                requests = await translate(body, header(scope, b"x-data-parallel-rank"))
                await self._generate(requests if isinstance(requests, list) else [requests], receive, send)
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
        if self.config.render_only:  # the tokenizer, template and config loaded before the server started
            return JSONResponse({"ready": True, "render_only": True})
        missing = self.engines.not_ready()
        if missing:
            return JSONResponse({"ready": False, "missing": {str(k): v for k, v in missing.items()}}, 503)
        return JSONResponse({"ready": True, "ranks": [e.rank for e in self.engines.engines]})

    async def _models(self, request: Request) -> Response:
        """The base model, then each LoRA adapter every ready rank serves (vLLM's entries: `parent` the base
        model, `root` the path this process loaded it from, else its name)."""
        adapters = await self.adapters.refresh(max_age_s=1.0) if not self.config.render_only else set()
        return Response(responses.models(self.model.name, self._max_model_len(or_zero=True), self._created,
                                         {name: self.adapters.paths.get(name, name) for name in sorted(adapters)}),
                        media_type="application/json")

    async def _load_lora(self, request: Request) -> Response:
        """vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"}: on every ready rank, or on none."""
        body = await self._lora_body(request, LoadLoraBody)
        assert isinstance(body, LoadLoraBody)
        if body.load_inplace:
            raise APIError(400, "load_inplace=true (new weights under a loaded adapter's name) is not supported: "
                                "unload the adapter, then load it", param="load_inplace")
        await self.adapters.load(body.lora_name, body.lora_path)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

    async def _unload_lora(self, request: Request) -> Response:
        """vLLM's POST /v1/unload_lora_adapter {"lora_name"}."""
        body = await self._lora_body(request, UnloadLoraBody)
        await self.adapters.unload(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain")

    async def _lora_body(self, request: Request, kind: type[UnloadLoraBody]) -> UnloadLoraBody:
        if not self.config.allow_runtime_lora_updating:
            raise APIError(404, f"{request.url.path} is not served: start the frontend with "
                                "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) to load "
                                "and unload LoRA adapters at run time")
        if self.config.render_only:
            raise APIError(404, f"{request.url.path} is not served: this frontend runs with --render-only (no engines)")
        return parse(kind, await request.body())

    async def _openapi_json(self, request: Request) -> Response:
        """The document, its `model` enums naming the LoRA adapters served now (remade when they change)."""
        if not self.config.render_only:
            adapters = tuple(sorted(await self.adapters.refresh(max_age_s=1.0)))
            if adapters != self._openapi_adapters:
                self._openapi = msgspec.json.encode(openapi.document(
                    self.model.name, max_logprobs=self.config.max_logprobs, adapters=adapters))
                self._openapi_adapters = adapters
        return Response(self._openapi, media_type="application/json")

    async def _version(self, request: Request) -> Response:
        """As vLLM's GET /version: {"version": ...}, this fleet's package version."""
        try:
            version = metadata.version("fleet")
        except metadata.PackageNotFoundError:  # run from a source tree that was never installed
            version = "unknown"
        return JSONResponse({"version": version})

    # ---- preprocessing (JSON in, JSON out; no engine) ----

    async def _tokenize(self, body: bytes) -> bytes:
        tokenized = await self.translator.tokenize(body)
        return tokenized.body(self._context_len())

    async def _render_chat(self, body: bytes) -> bytes:
        request = await self.translator.chat(body, None, render=True)
        return render.chat_body(request, request.request.lora or self.model.name)

    async def _render_completion(self, body: bytes) -> bytes:
        requests = await self.translator.completion(body, None, render=True)
        return render.completion_body(requests, requests[0].request.lora or self.model.name)

    async def _metrics(self, request: Request) -> Response:
        self.update_gauges()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def _engine_views(self) -> list[EngineView]:
        return [EngineView(e.rank, e.stats if e.state == "ready" else None,
                           e.ready.block_size if e.ready else 0, e.ready.num_kv_blocks if e.ready else 0)
                for e in self.engines.engines]

    def update_gauges(self) -> None:
        """This process's own gauges of engine state: at each scrape, and every second in each API
        server (with several, one process answers the scrape for all of them)."""
        m, name = self.metrics, self.model.name
        m.flush()
        m.engines_ready.set(len(self.engines.engines) - len(self.engines.not_ready()))
        for engine in self.engines.engines:
            m.engine_streams.labels(name, str(engine.rank)).set(len(engine.inflight))

    # ---- generation (lean ASGI) ----

    async def _generate(self, requests: list[EngineRequest], receive: Receive, send: Send) -> None:
        """Placement, then output processing into the writers, until the response is sent."""
        with self.launch(requests) as (prompts, streams, wakeup):

            def fail(message: str) -> None:
                for stream in streams:
                    stream.fail(message)

            watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, fail))
            try:
                options = requests[0].output
                name = requests[0].request.lora or self.model.name  # as vLLM: the adapter's name, if one
                if options.token_out:
                    await send_tokens(send, prompts[0][0], name)
                elif options.stream:
                    await send_stream(send, prompts, name, wakeup)
                else:
                    await send_completion(send, prompts, name)
            finally:
                watcher.cancel()

    @contextlib.contextmanager
    def launch(self, requests: list[EngineRequest]) -> Iterator[tuple[list[list[OutputProcessor]], list[Stream],
                                                                      Wakeup | None]]:
        """Place and submit a response's engine requests; inside, their output processors (per prompt, per
        choice), streams and shared wake-up; on leaving, every one still at its engine is aborted. HTTP's
        writers and gRPC's (grpc_server.py) run inside it. `requests`: one per prompt (a completions batch
        has several), each with its n choices; every choice is an engine request of its own, and a prompt's
        choices go to one engine, whose prefix cache the later ones hit (the engine caches a prompt's blocks
        as it schedules them, as vLLM's does). Raises APIError when no engine can take them."""
        if self.shutdown.cut is not None:  # its body or tokens arrived after the shutdown deadline
            raise APIError(503, self.shutdown.cut)
        try:
            engines = [self.dispatcher.choose(request) for request in requests]
        except NoEngine as exc:
            raise APIError(exc.status, str(exc), param=PIN_HEADER if exc.status == 400 else None) from None
        several = len(requests) > 1 or requests[0].n > 1
        wakeup = Wakeup() if several else None
        prompts: list[list[OutputProcessor]] = []
        streams: list[Stream] = []
        try:
            for request, engine in zip(requests, engines, strict=True):
                parent = self.metrics.parent(request.n) if request.n > 1 else None
                choices = []
                for choice in request.choices():
                    stream = Stream(choice.request_id, choice.prompt_len, choice.max_tokens)
                    stream.group = wakeup
                    if choice.output.stream:
                        stream.interval = choice.output.stream_interval
                    choices.append(OutputProcessor(stream, choice, tokenizer=self.model.tokenizer,
                                                   engines=self.dispatcher, metrics=self.metrics,
                                                   parser=self._parser(choice.output), parent=parent))
                    self.dispatcher.submit(engine, stream, choice)
                    self.metrics.running.inc()
                    self.metrics.prompt_tokens.inc(choice.prompt_len)
                    streams.append(stream)
                prompts.append(choices)
            with self.shutdown.running(*streams):
                yield prompts, streams, wakeup
        finally:
            for stream in streams:
                self.dispatcher.abort(stream)  # a no-op unless it is still running at its engine
                self.metrics.running.dec()

    @staticmethod
    def _parser(options: OutputOptions) -> OutputParser | TokenOutputParser | None:
        """The request's output parser: reasoning and tool calls, or a forced tool_choice's."""
        # A forced tool_choice's output is structured from its first token: no reasoning to split off.
        if isinstance(options.tool_choice, dict):
            return NamedToolParser(options.tool_choice["function"]["name"])
        if options.tool_choice == "required":
            return RequiredToolParser()
        if options.tool_parser is not None or options.reasoning_parser is not None:
            return build_parser(options.tool_parser, options.reasoning_parser, tools=list(options.tools),
                                prompt=options.prompt_tail)
        return None

    def _engine_problem(self, minor: int, *, backend: str | None = "vllm") -> str | None:
        """Why some ready engine is older than protocol 1.<minor> (it would drop the fields unread) or,
        unless `backend` is None, not of that backend (only the vllm backend honours structured output
        and the logits controls; every backend sends logprobs), or None (translation.EngineProblem)."""
        for engine in self.engines.engines:
            ready = engine.ready
            if ready is None:
                continue
            old = (ready.major, ready.minor) < (1, minor)
            if backend is not None and (old or ready.backend != backend):
                return (f"engine rank {engine.rank} cannot (its {ready.backend} backend, protocol "
                        f"{ready.major}.{ready.minor}; the {backend} backend with protocol 1.{minor} or newer can)")
            if old:
                return (f"engine rank {engine.rank} does not (protocol {ready.major}.{ready.minor}; "
                        f"1.{minor} or newer does)")
        return None

    def _max_model_len(self, *, or_zero: bool = False) -> int:
        if self.config.render_only:
            return self._context_len()
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if not lens:
            if or_zero:
                return 0
            raise APIError(503, "no engine has handshaken yet: " + str(self.engines.not_ready()))
        return min(lens)

    def _context_len(self) -> int:
        """The context length for the routes that need no engine (render, tokenize): the engines' once one
        has handshaken, else --max-model-len or the model config's (render-only mode has no engine to ask)."""
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if lens:
            return min(lens)
        configured = self.config.max_model_len or self.model.config_max_model_len
        if configured is None:  # render-only refuses to start so (server.py); a frontend waits for its engines
            raise APIError(503, "no engine has handshaken yet and the model's config.json gives no context length")
        return configured


async def _api_error(request: Request, exc: Exception) -> Response:
    """An APIError raised by a starlette route, in the OpenAI error shape."""
    assert isinstance(exc, APIError)
    return Response(exc.body(), exc.status, media_type="application/json")


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
