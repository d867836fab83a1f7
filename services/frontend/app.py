"""The frontend's ASGI app. The two generation routes are served by a lean ASGI handler (no
middleware send wrappers, one body send per batch of queued events, disconnects watched directly);
starlette routes everything else.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from protocol import ERROR_DRAINING, ERROR_INVALID, GenerateRequest
from protocol.block_hash import block_hashes
from services.frontend import responses
from services.frontend.asgi import (
    ClientGone,
    header,
    read_body,
    send_json,
    watch_disconnect,
)
from services.frontend.config import FrontendConfig
from services.frontend.detokenizer import IncrementalDetokenizer
from services.frontend.engines import EngineSet
from services.frontend.errors import APIError, error_body
from services.frontend.metrics import Metrics
from services.frontend.model import Model
from services.frontend.placement import NoEngine, Placement
from services.frontend.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    check_common,
    parse,
    sampling_params,
    stop_list,
)
from services.frontend.stop_strings import StopChecker
from services.frontend.stream import EngineFailure, Stream

log = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Frontend:
    def __init__(self, config: FrontendConfig, model: Model, engines: EngineSet, metrics: Metrics) -> None:
        self.config = config
        self.model = model
        self.engines = engines
        self.metrics = metrics
        self.placement = Placement()
        self._created = int(time.time())
        self._pool = ThreadPoolExecutor(config.max_concurrent_tokenizations, thread_name_prefix="tokenize")
        self._lean: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            "/v1/chat/completions": self._chat, "/v1/completions": self._completions}
        self.starlette = Starlette(routes=[
            Route("/health", self._health), Route("/ready", self._ready),
            Route("/v1/models", self._models), Route("/metrics", self._metrics)])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._lean.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None:
            await self.starlette(scope, receive, send)
            return
        if scope["method"] != "POST":
            await send_json(send, 405, error_body(405, f"{scope['path']} accepts POST only"))
            return
        try:
            await handler(scope, receive, send)
        except APIError as exc:
            await send_json(send, exc.status, exc.body())
        except ClientGone:
            pass

    # ---- plain routes (starlette) ----

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _ready(self, request: Request) -> Response:
        missing = self.engines.not_ready()
        self.metrics.engines_ready.set(len(self.engines.engines) - len(missing))
        if missing:
            return JSONResponse({"ready": False, "missing": {str(k): v for k, v in missing.items()}}, 503)
        return JSONResponse({"ready": True, "ranks": [e.rank for e in self.engines.engines]})

    async def _models(self, request: Request) -> Response:
        return Response(responses.models(self.model.name, self._max_model_len(or_zero=True), self._created),
                        media_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    # ---- generation routes (lean ASGI) ----

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(scope, receive, self.config.max_body_bytes)
        req: ChatCompletionRequest = parse(ChatCompletionRequest, body)
        self._check_model(req.model)
        check_common(req)
        if req.max_completion_tokens is not None:
            if req.max_completion_tokens < 1:
                raise APIError(400, f"max_completion_tokens={req.max_completion_tokens} is out of range: "
                               "must be >= 1", param="max_completion_tokens")
            req.max_tokens = req.max_completion_tokens
        if req.logprobs or req.top_logprobs:
            raise APIError(400, "logprobs are not supported by this server yet", param="logprobs")
        if req.add_generation_prompt and req.continue_final_message:
            raise APIError(400, "add_generation_prompt and continue_final_message cannot both be true",
                           param="continue_final_message")
        messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
        if not messages:
            raise APIError(400, "messages: at least one message is required", param="messages")
        long = len(body) > self.config.long_prompt_chars  # messages, tools and kwargs all count
        ids = await self._off_loop(long, self._render_and_encode, messages, req)
        await self._generate(scope, receive, send, req, ids, chat=True, request_id=f"chatcmpl-{os.urandom(12).hex()}")

    def _render_and_encode(self, messages: list[dict[str, Any]], req: ChatCompletionRequest) -> list[int]:
        from services.frontend.chat_template import TemplateError

        try:
            text = self.model.template.render(
                messages, tools=req.tools, add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs)
        except TemplateError as exc:
            raise APIError(400, f"chat template error: {exc}", param="messages") from None
        return self.model.encode(text, add_special_tokens=False)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        req: CompletionRequest = parse(CompletionRequest, await read_body(scope, receive, self.config.max_body_bytes))
        self._check_model(req.model)
        check_common(req)
        if req.echo or req.suffix is not None or req.logprobs is not None:
            field = "echo" if req.echo else "suffix" if req.suffix is not None else "logprobs"
            raise APIError(400, f"{field} is not supported by this server yet", param=field)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "prompt: batches of prompts are not supported; send one prompt per request",
                               param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and not all(type(t) is int for t in prompt):
            raise APIError(400, "prompt: expected a string, a list of token ids, or a list with one of those",
                           param="prompt")
        if isinstance(prompt, str):
            ids = await self._off_loop(len(prompt) > self.config.long_prompt_chars, self.model.encode, prompt,
                                       add_special_tokens=req.add_special_tokens)
        else:
            ids = list(prompt)  # type: ignore[arg-type]
            vocab = self.model.tokenizer.get_vocab_size(with_added_tokens=True)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(400, f"prompt: token id {bad} is out of range [0, {vocab})", param="prompt")
        if not ids:
            raise APIError(400, "prompt: must not be empty", param="prompt")
        await self._generate(scope, receive, send, req, ids, chat=False, request_id=f"cmpl-{os.urandom(12).hex()}")

    async def _generate(self, scope: Scope, receive: Receive, send: Send, req: Any, ids: list[int], *,
                        chat: bool, request_id: str) -> None:
        max_len = self._max_model_len()
        prompt_len = len(ids)
        if prompt_len >= max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens, but the prompt "
                           f"has {prompt_len} tokens", param="messages" if chat else "prompt")
        # As OpenAI and vLLM: chat may use the rest of the context, a text completion defaults to 16.
        default = max_len - prompt_len if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, max_len - prompt_len)
        max_tokens = req.max_tokens if req.max_tokens is not None else default
        if prompt_len + max_tokens > max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you "
                           f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                           f"{max_tokens} for the completion)", param="max_tokens")
        sampling = sampling_params(req, max_tokens, self.model.tokenizer.get_vocab_size(with_added_tokens=True))
        pinned = _pinned_rank(header(scope, b"x-data-parallel-rank"))
        stream = Stream(request_id, prompt_len, max_tokens)

        def hashes(block_size: int) -> list[int]:
            return block_hashes(ids, block_size, salt=req.cache_salt)

        try:
            engine, cached = self.placement.choose(self.engines.engines, prompt_len, hashes, pinned=pinned,
                                                   request_id=request_id)
        except NoEngine as exc:
            raise APIError(exc.status, str(exc), param="X-Data-Parallel-Rank" if exc.status == 400 else None) from None
        request = GenerateRequest(request_id, ids, sampling, time.time(), req.priority, None, req.cache_salt, pinned)
        run = _Run(self, req, stream, ids, time.monotonic(), request, hashes)
        self.engines.submit(engine, stream, request)
        self.metrics.running.inc()
        self.metrics.prompt_tokens.inc(prompt_len)
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, stream.fail))
        try:
            if req.stream:
                await run.stream(send, responses.ChunkWriter(request_id, self.model.name, chat=chat),
                                 req.stream_options is not None and req.stream_options.include_usage,
                                 req.stream_options is not None and req.stream_options.include_usage
                                 and req.stream_options.continuous_usage_stats)
            else:
                await run.complete(send, chat)
        finally:
            watcher.cancel()
            self.engines.abort(stream)  # a no-op unless it is still running at its engine
            self.metrics.running.dec()

    # ---- helpers ----

    def _check_model(self, name: str) -> None:
        if name != self.model.name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model.name}`",
                           param="model", code="model_not_found")

    def _max_model_len(self, *, or_zero: bool = False) -> int:
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if not lens:
            if or_zero:
                return 0
            raise APIError(503, "no engine has handshaken yet: " + str(self.engines.not_ready()))
        return min(lens)

    async def _off_loop(self, long: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Long prompts are rendered and tokenized in a worker thread, so other streams keep flowing."""
        if not long:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))


class _Run:
    """Turns one request's engine outputs into text: detokenize, stop strings, counts, timings."""

    __slots__ = (
        "cached_tokens",
        "completion_tokens",
        "counts",
        "detok",
        "fe",
        "finish",
        "hashes",
        "last",
        "req",
        "request",
        "sink",
        "started",
        "stop_reason",
        "stops",
        "tried",
    )

    def __init__(self, fe: Frontend, req: Any, stream: Stream, ids: list[int], started: float,
                 request: GenerateRequest, hashes: Callable[[int], list[int]]) -> None:
        self.fe, self.req, self.sink, self.started = fe, req, stream, started
        self.request, self.hashes = request, hashes  # to place it again if a draining rank refuses it
        self.tried: set[int] = set()  # engine indexes that refused it while draining
        self.detok = IncrementalDetokenizer(fe.model.tokenizer, ids, skip_special_tokens=req.skip_special_tokens)
        stops = stop_list(req)
        self.stops = StopChecker(stops, include_stop_str_in_output=req.include_stop_str_in_output) if stops else None
        self.last = 0.0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish: str | None = None
        self.stop_reason: int | str | None = None
        self.counts: list[int] = []  # completion tokens so far at each of the latest pieces

    async def pieces(self) -> list[str]:
        """Text of everything the engine produced since the last call; sets finish when done."""
        outs = await self.sink.next()
        now = time.monotonic()
        m = self.fe.metrics
        pieces: list[str] = []
        counts = self.counts = []
        for out in outs:
            n = len(out.new_token_ids)
            if n:
                if self.completion_tokens == 0:
                    m.ttft.observe(now - self.started)
                    self.cached_tokens = out.num_cached_tokens
                else:
                    m.itl.observe(now - self.last)
                self.last = now
                self.completion_tokens += n
            text = self.detok.push(out.new_token_ids) if n else ""
            if out.finish_reason is not None:
                if out.finish_reason == "error" and out.error_kind == ERROR_DRAINING and self._place_again():
                    continue
                if out.finish_reason in ("error", "abort"):
                    raise EngineFailure(out.error or f"the engine ended the request ({out.finish_reason})",
                                        400 if out.error_kind == ERROR_INVALID else 503)
                text += self.detok.flush()
            if self.stops is not None:
                text, matched = self.stops.push(text)
                if matched is not None:
                    self.finish, self.stop_reason = "stop", matched
                    self.fe.engines.abort(self.sink)
                    if text:
                        pieces.append(text)
                        counts.append(self.completion_tokens)
                    break
                if out.finish_reason is not None:
                    text += self.stops.flush()
            if text:
                pieces.append(text)
                counts.append(self.completion_tokens)
            if out.finish_reason is not None:
                self.finish, self.stop_reason = out.finish_reason, out.stop_reason
                break
        return pieces

    def _place_again(self) -> bool:
        """A draining rank turned the request away before generating any of it: place it on another
        rank (not pinned requests: they asked for that rank). False when there is none to try."""
        stream = self.sink
        if self.completion_tokens or self.request.pinned_rank is not None or stream.gone is not None:
            return False  # tokens were produced, the rank was asked for, or the client left meanwhile
        self.tried.add(stream.engine_index)
        engines = [e for e in self.fe.engines.engines if e.index not in self.tried]
        try:
            engine, _ = self.fe.placement.choose(engines, stream.prompt_len, self.hashes,
                                                 request_id=stream.request_id)
        except NoEngine:
            return False
        log.info("request %s: rank %d is draining; placing it on rank %d", stream.request_id, stream.rank,
                 engine.rank)
        stream.finished = stream.started = False
        self.fe.engines.submit(engine, stream, self.request)
        return True

    def _done(self) -> dict[str, Any]:
        m = self.fe.metrics
        m.generation_tokens.inc(self.completion_tokens)
        m.e2e.observe(time.monotonic() - self.started)
        m.finished(self.finish or "error")
        return responses.usage(self.sink.prompt_len, self.completion_tokens, self.cached_tokens)

    async def complete(self, send: Send, chat: bool) -> None:
        parts: list[str] = []
        try:
            while self.finish is None:
                parts += await self.pieces()
        except EngineFailure as exc:
            self.fe.metrics.finished("error")
            await send_json(send, exc.status, error_body(exc.status, str(exc)))
            return
        build = responses.chat_completion if chat else responses.text_completion
        body = build(self.sink.request_id, self.fe.model.name, "".join(parts), self.finish,  # type: ignore[arg-type]
                     self.stop_reason, self._done())
        await send_json(send, 200, body, [(b"x-data-parallel-rank", str(self.sink.rank).encode())])

    async def stream(self, send: Send, writer: responses.ChunkWriter, include_usage: bool,
                     continuous_usage: bool = False) -> None:
        """continuous_usage: every chunk carries the usage so far (vLLM's continuous_usage_stats).

        The response starts with the first output, so that x-data-parallel-rank names the rank that
        serves it (also after a draining rank's refusal moved it) and a failure before any output
        gets its own status rather than an error event."""
        text = writer.text
        started = False
        try:
            while self.finish is None:
                pieces = await self.pieces()
                if continuous_usage:
                    events = [text(p, self._usage(n)) for p, n in zip(pieces, self.counts)]
                else:
                    events = [text(p) for p in pieces]
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        *_SSE_HEADERS, (b"x-data-parallel-rank", str(self.sink.rank).encode())]})
                    if writer._chat:
                        events.insert(0, writer.role(self._usage(0) if continuous_usage else None))
                if self.finish is not None:
                    so_far = self._usage(self.completion_tokens) if continuous_usage else None
                    events.append(writer.finish(self.finish, self.stop_reason, so_far))
                    use = self._done()
                    if include_usage:
                        events.append(writer.usage(use))
                    events.append(responses.DONE)
                if events:
                    await send({"type": "http.response.body", "body": b"".join(events),
                                "more_body": self.finish is None})
        except EngineFailure as exc:
            self.fe.metrics.finished("error")
            if not started:
                await send_json(send, exc.status, error_body(exc.status, str(exc)),
                                 [(b"x-data-parallel-rank", str(self.sink.rank).encode())])
                return
            await send({"type": "http.response.body", "body": writer.error(exc.status, str(exc)) + responses.DONE,
                        "more_body": False})

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        return responses.usage(self.sink.prompt_len, completion_tokens, self.cached_tokens)


def _pinned_rank(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        got = value.decode(errors="replace")
        raise APIError(400, f"X-Data-Parallel-Rank must be an integer rank, got {got!r}",
                       param="X-Data-Parallel-Rank") from None


def _message_dict(i: int, message: Any) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(message)
    content = d.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.get("type") != "text" or part.get("text") is None:
                raise APIError(400, f"messages[{i}].content[{j}]: only text content parts are supported",
                               param=f"messages[{i}].content[{j}]")
            texts.append(part["text"])
        d["content"] = "\n".join(texts)
    return d
