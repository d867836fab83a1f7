"""The frontend's ASGI app, one per API server process. The generation routes (chat, completions, and
token-in /inference/v1/generate) are served by a lean ASGI handler (no middleware send wrappers, one
body send per batch of queued events, disconnects watched directly) that runs the stages in turn, and
so are the pooling routes (/v1/embeddings, /pooling: one JSON answer per request); the
preprocessing routes (render, tokenize, detokenize: JSON in, JSON out, no engine) by a plain one;
starlette routes everything else. In render-only mode (--render-only) there are no engines and the
generation routes are not served.
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import tracing
from edge.api_keys import HOW_TO_SEND, ApiKeys, KeyCheck
from services.frontend.engine_client.inflight import CLIENT_GONE, EngineFailure
from services.frontend.engine_client.lora import LoadLoraBody, UnloadLoraBody
from services.frontend.errors import APIError, error_body
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import EngineView
from services.frontend.http_api import openai_bodies, openapi, render
from services.frontend.http_api.asgi import (
    CLOSE,
    ClientGone,
    header,
    read_body,
    send_json,
    watch_disconnect,
)
from services.frontend.http_api.connections import on_client_gone
from services.frontend.http_api.direct_stream import HttpCycle, cycle_of
from services.frontend.http_api.response_writer import send_completion, send_stream, send_tokens
from services.frontend.requests import classify, scoring
from services.frontend.requests.cohere_embed import cohere_embed
from services.frontend.requests.embeddings import embeddings
from services.frontend.requests.engine_request import EngineRequest
from services.frontend.requests.json_body import parse
from services.frontend.requests.pooling_job import PoolingJob
from services.frontend.requests.pooling_model import POOLING_TASKS
from services.frontend.requests.pooling_request import pooling
from services.frontend.requests.translator import pinned_rank

# The routes --api-key guards (vLLM's: everything under /v1, and the token-in, render and tokenize routes);
# /health, /ready, /metrics, /version and /openapi.json stay open for probes and scrapers.
_GUARDED = ("/v1/", "/v2/", "/inference/", "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank")
# Each lean route's API as vLLM names it in a refusal, and the tasks one of which the engines must serve.
_SCORING = ("embed", "classify", "token_embed")  # token_embed: late interaction, refused by its translator
_APIS = {"/v1/chat/completions": (("generate",), "Chat Completions"), "/v1/completions": (("generate",), "Completions"),
         "/inference/v1/generate": (("generate",), "generate tokens"), "/v1/embeddings": (("embed",), "Embeddings"),
         "/v2/embed": (("embed",), "Embeddings"),
         "/pooling": (POOLING_TASKS, "Pooling"), "/classify": (("classify",), "Classification"),
         "/score": (_SCORING, "Score"), "/v1/score": (_SCORING, "Score"), "/rerank": (_SCORING, "Rerank (Score)"),
         "/v1/rerank": (_SCORING, "Rerank (Score)"), "/v2/rerank": (_SCORING, "Rerank (Score)")}
# A classify, score or rerank body past this many bytes is translated in a thread (its tokenizing lets go
# of the GIL), as the embeddings route tokenizes a large batch.
_THREADED_BODY = 16_384


class Frontend:
    """The HTTP face over a FrontendCore (generation/frontend_core.py), which gRPC's face shares."""

    def __init__(self, core: FrontendCore) -> None:
        self.core = core
        self.config = config = core.config
        self.model = model = core.model
        self.engines, self.metrics, self.shutdown = core.engines, core.metrics, core.shutdown
        self.translator, self.lora = core.translator, core.lora
        self.metrics.watch_engines(self._engine_views)
        self._created = int(time.time())
        self._keys = ApiKeys(config.api_keys)
        self._openapi = msgspec.json.encode(openapi.document(model.name, render_only=config.render_only,
                                                             max_logprobs=config.max_logprobs))
        self._openapi_adapters: tuple[str, ...] = ()  # the adapters self._openapi names
        self._lean: dict[str, Callable[[bytes, bytes | None], Awaitable[EngineRequest | list[EngineRequest]]]] = {
            "/v1/chat/completions": self.translator.chat, "/v1/completions": self.translator.completion,
            "/inference/v1/generate": self.translator.generate}
        # Pooling routes: a body (and the X-Request-Id header) becomes a PoolingJob.
        self._pooling: dict[str, Callable[[bytes, bytes | None], Awaitable[PoolingJob]]] = {
            "/v1/embeddings": lambda body, rid: embeddings(model, body, core.max_model_len, rid),
            "/v2/embed": lambda body, rid: cohere_embed(model, body, core.max_model_len, rid),
            "/pooling": lambda body, rid: pooling(model, body, core.max_model_len, self._tasks,
                                                  core.pooling_model.pooling_task, rid),
            "/classify": functools.partial(self._scoring, classify.translate)}
        for path in ("/score", "/v1/score"):
            self._pooling[path] = functools.partial(self._scoring, scoring.translate_score)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            self._pooling[path] = functools.partial(self._scoring, scoring.translate_rerank)
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
        pool = self._pooling.get(path) if path is not None else None
        if pool is not None:
            translate = pool  # type: ignore[assignment]  # served as the generation routes are, up to the writer
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
        # The request's server span continues the caller's trace (the router's upstream attempt, a client's).
        with self.shutdown.handling(), tracing.server_span("frontend.request", scope["headers"],
                                                          {"http.route": path}) as span:
            try:
                body = await read_body(scope, receive, self.config.max_body_bytes, self.config.header_timeout_s)
                if preprocess is not None:
                    await send_json(send, 200, await preprocess(body))
                    return
                assert translate is not None and path is not None
                tasks, api = _APIS[path]
                self.core.refuse_task(tasks, api)
                if pool is not None:
                    with tracing.span("frontend.translate"):
                        job = await pool(body, header(scope, b"x-request-id"))
                    await self._pool(job, header(scope, b"x-data-parallel-rank"), receive, send)
                    return
                with tracing.span("frontend.translate"):
                    requests = await translate(body, header(scope, b"x-data-parallel-rank"))
                await self._generate(requests if isinstance(requests, list) else [requests], receive, send,
                                     cycle_of(send))
            except APIError as exc:
                if span is not None:
                    span.set_attribute("http.response.status_code", exc.status)
                    if exc.status >= 500:  # a refusal of the client's request (4xx) is not the server's error
                        tracing.fail(span, str(exc))
                await send_json(send, exc.status, exc.body(), CLOSE if exc.status == 408 else None)
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
        # "Can serve": some rank takes new requests. The others are named (a router that health-checks
        # /ready must not drop a replica that serves because one of its ranks is slow or restarting).
        serving, missing = self.engines.serving(), self.engines.not_ready()
        body: dict[str, object] = {"ready": bool(serving), "ranks": serving}
        if missing:
            body["missing"] = {str(k): v for k, v in missing.items()}
        return JSONResponse(body, 200 if serving else 503)

    async def _models(self, request: Request) -> Response:
        """The base model, then each LoRA adapter every ready rank serves (vLLM's entries: `parent` the base
        model, `root` the path this process loaded it from, else its name)."""
        adapters = await self.lora.refresh(max_age_s=1.0) if not self.config.render_only else set()
        return Response(openai_bodies.models(self.model.name, self.core.max_model_len(or_zero=True), self._created,
                                         {name: self.lora.paths.get(name, name) for name in sorted(adapters)},
                                         self.engines.tasks()),
                        media_type="application/json")

    async def _load_lora(self, request: Request) -> Response:
        """vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"}: on every ready rank, or on none."""
        body = await self._lora_body(request, LoadLoraBody)
        assert isinstance(body, LoadLoraBody)
        if body.load_inplace:
            raise APIError(400, "load_inplace=true (new weights under a loaded adapter's name) is not supported: "
                                "unload the adapter, then load it", param="load_inplace")
        await self.lora.load(body.lora_name, body.lora_path)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

    async def _unload_lora(self, request: Request) -> Response:
        """vLLM's POST /v1/unload_lora_adapter {"lora_name"}."""
        body = await self._lora_body(request, UnloadLoraBody)
        await self.lora.unload(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain")

    async def _lora_body(self, request: Request, kind: type[UnloadLoraBody]) -> UnloadLoraBody:
        if not self.config.allow_runtime_lora_updating:
            raise APIError(404, f"{request.url.path} is not served: start the frontend with "
                                "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) to load "
                                "and unload LoRA adapters at run time")
        if self.config.render_only:
            raise APIError(404, f"{request.url.path} is not served: this frontend runs with --render-only (no engines)")
        return parse(kind, await read_body(request.scope, request.receive, self.config.max_body_bytes,
                                           self.config.header_timeout_s))

    async def _openapi_json(self, request: Request) -> Response:
        """The document, its `model` enums naming the LoRA adapters served now (remade when they change)."""
        if not self.config.render_only:
            adapters = tuple(sorted(await self.lora.refresh(max_age_s=1.0)))
            if adapters != self._openapi_adapters:
                self._openapi = msgspec.json.encode(openapi.document(
                    self.model.name, max_logprobs=self.config.max_logprobs, adapters=adapters))
                self._openapi_adapters = adapters
        return Response(self._openapi, media_type="application/json")

    async def _version(self, request: Request) -> Response:
        """As vLLM's GET /version: {"version": ...}, this fleet's package version."""
        return JSONResponse({"version": self.core.version})

    # ---- preprocessing (JSON in, JSON out; no engine) ----

    async def _tokenize(self, body: bytes) -> bytes:
        tokenized = await self.translator.tokenize(body)
        return tokenized.body(self.core.context_len())

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

    async def _generate(self, requests: list[EngineRequest], receive: Receive, send: Send,
                        cycle: HttpCycle | None = None) -> None:
        """Placement, then output processing into the writers, until the response is sent. `cycle`:
        uvicorn's request cycle, through which a stream's events are written in the dispatch pass."""
        with self.core.launch(requests) as (prompts, streams, wakeup):

            def fail(message: str) -> None:
                for stream in streams:
                    stream.fail(message)

            # Under this server's uvicorn protocol the connection says when the client leaves; elsewhere a
            # task watches receive() for it.
            watched = cycle is not None and on_client_gone(cycle, fail)
            watcher = None if watched else asyncio.get_running_loop().create_task(watch_disconnect(receive, fail))
            try:
                options = requests[0].output
                name = requests[0].request.lora or self.model.name  # as vLLM: the adapter's name, if one
                if options.token_out:
                    await send_tokens(send, prompts[0][0], name, cycle)
                elif options.stream:
                    await send_stream(send, prompts, name, wakeup, cycle)
                else:
                    await send_completion(send, prompts, name)
            finally:
                if watcher is not None:
                    watcher.cancel()
                else:
                    on_client_gone(cycle, None)


    async def _pool(self, job: PoolingJob, pin: bytes | None, receive: Receive, send: Send) -> None:
        """A pooling job's inputs placed together, gathered in order, answered in one JSON body."""
        with self.core.pooling.launch(job, pinned_rank(pin)) as run:

            def fail(message: str) -> None:
                for stream in run.streams:
                    stream.fail(message)

            watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, fail))
            try:
                outputs, prompt_tokens = await self.core.pooling.gather(run)
                # The writers trust the shapes gather checked; one that still cannot read the values
                # answers as an engine failure, not a bare 500.
                body = job.respond(outputs, prompt_tokens)
            except EngineFailure as exc:
                if any(stream.gone == CLIENT_GONE for stream in run.streams):
                    raise ClientGone from None  # nobody to answer
                raise APIError(exc.status, str(exc), param=exc.param) from None
            except ValueError as exc:
                raise APIError(503, f"the engines' pooled outputs cannot be read: {exc}") from None
            finally:
                watcher.cancel()
        await send_json(send, 200, _json.encode(body))

    async def _scoring(self, translate: Callable[..., PoolingJob], body: bytes, rid: bytes | None) -> PoolingJob:
        """A classify, score or rerank body through its translator (requests/classify.py, scoring.py)."""
        call = functools.partial(translate, body, self.core.pooling_model, max_model_len=self.core.max_model_len(),
                                 tasks=self._tasks(), request_id=rid.decode("latin-1") if rid else None)
        return await asyncio.to_thread(call) if len(body) > _THREADED_BODY else call()

    def _tasks(self) -> list[str]:
        """The engines' tasks (503 while none has handshaken)."""
        tasks = self.engines.tasks()
        if tasks is None:
            raise APIError(503, "no engine has handshaken yet: " + str(self.engines.not_ready()))
        return tasks


_json = msgspec.json.Encoder()


async def _api_error(request: Request, exc: Exception) -> Response:
    """An APIError raised by a starlette route, in the OpenAI error shape."""
    assert isinstance(exc, APIError)
    return Response(exc.body(), exc.status, headers={"connection": "close"} if exc.status == 408 else None,
                    media_type="application/json")


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
