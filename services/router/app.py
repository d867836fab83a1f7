"""The router's HTTP side (one ASGI app for every listener, told apart by the port a request came in
on): API keys, the public APIs, dispatch to replicas with retry before the first byte, 429 at the
cap, streaming passed through as it arrives, the Responses and Messages adapters, and escalate."""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.router import escalate
from services.router.adapters import AdapterError
from services.router.adapters.anthropic import MessagesStream, anthropic_error, chat_to_message, messages_to_chat
from services.router.adapters.responses import ResponsesStream, chat_to_response, responses_to_chat
from services.router.config import EscalateAlgorithm, ListenerConfig, RouterConfig
from services.router.metrics import RouterMetrics
from services.router.replicas import Lease, NoReplica, Overloaded
from services.router.routing import Choice, Router, UnknownModel
from services.router.sse import SSEData
from services.router.upstream import READ_ERRORS, Response, Upstream, UpstreamError

log = logging.getLogger("router")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

POST_APIS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
             "/v1/messages": "messages", "/v1/decisions": "decisions"}
UPSTREAM_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                 "responses": "/v1/chat/completions", "messages": "/v1/chat/completions"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                502: "upstream_error", 503: "service_unavailable_error", 504: "timeout_error"}
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
OFF_LOOP_BYTES = 256 << 10  # requests larger than this are routed (signals evaluated) off the event loop


class HTTPError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or []
        self.counted = False  # in router_requests_total already


class _ClientGone(Exception):
    pass


class _Tracked:
    """The ASGI send of one request, remembering whether the response started and completed."""

    __slots__ = ("_send", "started", "complete", "counted")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = self.complete = False
        self.counted = False  # in router_requests_total already

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif not message.get("more_body", False):
            self.complete = True
        await self._send(message)


@dataclass(slots=True)
class _Call:
    """One public request on its way through the router."""
    listener: ListenerConfig
    api: str
    request: dict[str, Any]  # the body as the client sent it
    chat: dict[str, Any]  # as a chat or completions body (what goes upstream, but for the model)
    choice: Choice
    status: int = 0  # of the response started to the client
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # x-router-* for the client
    escalation: dict[str, Any] | None = None  # which escalate stage answered, told in non-streamed bodies


@dataclass(slots=True)
class _Opened:
    response: Response
    lease: Lease
    pool: str
    attempts: int


class RouterApp:
    def __init__(self, config: RouterConfig, router: Router, upstream: Upstream, metrics: RouterMetrics, *,
                 max_body_bytes: int = 32 << 20) -> None:
        self.config = config
        self.router = router
        self.upstream = upstream
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self._by_port = {listener.port: listener for listener in config.listeners}
        self._keys = {listener.name: tuple(k.encode() for k in listener.api_keys) for listener in config.listeners}
        self._entries = {listener.name: listener.entries or tuple(config.entries) for listener in config.listeners}
        self._created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        server = scope.get("server")
        listener = self._by_port.get(server[1] if server else -1, self.config.listeners[0])
        path, method = scope["path"], scope["method"]
        api = POST_APIS.get(path) or ("models" if path == "/v1/models" else None)
        send = _Tracked(send)
        try:
            if path == "/health":
                await _send_json(send, 200, _json.encode(self._health()))
                return
            self._authorize(listener, scope, api)
            if path == "/metrics":
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]})
                await send({"type": "http.response.body", "body": self.metrics.render()})
                return
            if api is None or api not in listener.apis:
                raise HTTPError(404, f"no route for {method} {path} on listener {listener.name!r}")
            wanted = "GET" if api == "models" else "POST"
            if method != wanted:
                raise HTTPError(405, f"{path} accepts {wanted} only")
            if api == "models":
                await _send_json(send, 200, _json.encode(self._models(listener)))
            elif api == "decisions":
                await _send_json(send, 200, _json.encode(self._decisions(listener, await self._body(scope, receive))))
            else:
                await self._generate(listener, api, scope, receive, send)
        except HTTPError as exc:
            if not exc.counted:
                self.metrics.requests.labels(listener.name, api or "other", str(exc.status)).inc()
            if send.started:  # too late for a status: end what was sent
                log.warning("%s %s failed after its response started: %s", method, path, exc.message)
                if not send.complete:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await _send_json(send, exc.status, _error_body(api, exc), exc.headers)
        except _ClientGone:
            pass
        except Exception as exc:
            # A bug, or an upstream answer no branch expected: the client still gets an error in its API's shape.
            log.exception("%s %s failed", method, path)
            if not send.counted:
                self.metrics.requests.labels(listener.name, api or "other", "500").inc()
            if not send.started:
                await _send_json(send, 500, _error_body(api, HTTPError(500, f"internal error: {type(exc).__name__}")))
            elif not send.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ---- plain routes ----

    def _health(self) -> dict[str, Any]:
        return {"status": "ok", "pools": {name: {"ready": sum(1 for r in pool.snapshot() if r["ready"]),
                                                 "replicas": len(pool.replicas)}
                                          for name, pool in self.router.pools.items()}}

    def _models(self, listener: ListenerConfig) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": self._created,
                                            "owned_by": "router"} for name in self._entries[listener.name]]}

    def _decisions(self, listener: ListenerConfig, raw: bytes) -> dict[str, Any]:
        body = _parse(raw)
        chat = body
        if "input" in body and "messages" not in body and "prompt" not in body:
            chat = _adapt(responses_to_chat, body)
        choice = self._choose(listener, chat)
        out = choice.describe()
        size = len(raw)
        for name in choice.plan:
            picked = self.router.pools[name].preview(size, text=choice.text)
            out["pool"] = name
            out["replicas"] = self.router.pools[name].snapshot()
            if isinstance(picked, Overloaded):
                out.update(replica=None, status="overloaded", reason=picked.reason)
            elif isinstance(picked, NoReplica):
                out.update(replica=None, status="no_replica", reason=picked.reason)
            else:
                out.update(replica=picked.url, status="ok", reason=self.router.pools[name].policy.last_reason)
                break
            if isinstance(choice.entry.algorithm, EscalateAlgorithm):
                break  # escalate always starts at its first stage
        return out

    def _authorize(self, listener: ListenerConfig, scope: Scope, api: str | None) -> None:
        keys = self._keys[listener.name]
        if not keys:
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
            elif name == b"x-api-key" and not given:
                given = value.strip()
        ok = False
        for key in keys:  # every key compared, in constant time each: no early exit to time
            ok |= hmac.compare_digest(given, key)
        if not ok:
            message = ("Incorrect API key provided." if given else
                       "Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`.")
            raise HTTPError(401, message, code="invalid_api_key")

    # ---- generation ----

    async def _generate(self, listener: ListenerConfig, api: str, scope: Scope, receive: Receive,
                        send: Send) -> None:
        raw = await self._body(scope, receive)
        request = _parse(raw)
        if api == "responses":
            chat = _adapt(responses_to_chat, request)
        elif api == "messages":
            chat = _adapt(messages_to_chat, request)
        else:
            if not isinstance(request.get("model"), str):
                raise HTTPError(400, "model: a model name (string) is required", param="model")
            chat = request
        if len(raw) > OFF_LOOP_BYTES:  # counting tokens or embedding a long text would stall every stream
            choice = await asyncio.to_thread(self._choose, listener, chat)
        else:
            choice = self._choose(listener, chat)
        call = _Call(listener, api, request, chat, choice)
        call.headers = [(b"x-router-entry", call.choice.entry.name.encode()),
                        (b"x-router-decision", call.choice.decision.name.encode())]
        self.metrics.decisions.labels(call.choice.entry.name, call.choice.decision.name).inc()
        task = asyncio.current_task()
        gone = asyncio.Event()
        watcher = asyncio.get_running_loop().create_task(
            _watch_disconnect(receive, task, gone, send))  # type: ignore[arg-type]
        try:
            if isinstance(call.choice.entry.algorithm, EscalateAlgorithm):
                await self._escalate(call, call.choice.entry.algorithm, send)
            else:
                await self._dispatch(call, send)
        except HTTPError as exc:
            call.status, exc.counted = exc.status, True
            exc.headers = call.headers + exc.headers
            raise
        except Exception:
            call.status = 500
            raise
        except asyncio.CancelledError:
            if not gone.is_set():
                raise
            # The client left: the upstream response was closed on the way out, which aborts it there.
            task.uncancel()  # type: ignore[union-attr]
            call.status = 499
        finally:
            watcher.cancel()
            self.metrics.requests.labels(listener.name, api, str(call.status)).inc()
            send.counted = True  # type: ignore[attr-defined]

    async def _dispatch(self, call: _Call, send: Send) -> None:
        payloads: dict[str, bytes] = {}
        opened = await self._open_any(call, call.choice.plan, payloads, None)
        call.headers += [(b"x-router-pool", opened.pool.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode())]
        response = opened.response
        ok: bool | None = None  # None: abandoned (the client left), which says nothing about the replica
        try:
            if response.status != 200:
                await self._upstream_refusal(call, response, send)
                ok = True
            elif call.api in ("chat", "completions"):
                ok = await self._pass_through(call, response, send)
            elif call.chat.get("stream"):
                ok = await self._adapt_stream(call, response, send)
            else:
                chat = _decode_object(await response.read())
                await self._send_adapted(call, chat, send)
                ok = True
        except (*READ_ERRORS, UpstreamError) as exc:
            ok = False
            log.warning("upstream %s failed mid-response: %s", opened.lease.replica.url, exc)
            if call.status == 0:
                raise HTTPError(502, f"upstream {opened.lease.replica.url} failed: {exc}") from None
        finally:
            response.close()
            opened.lease.release(ok)
            if ok is False:
                self.metrics.upstream_errors.labels(opened.pool).inc()

    async def _open_any(self, call: _Call, pools: tuple[str, ...], payloads: dict[str, bytes],
                        timeout_s: float | None, *, stream: bool | None = None) -> _Opened:
        """The first of `pools` with a free replica that answers; the refusal that says most otherwise."""
        refusals: list[HTTPError] = []
        for name in pools:
            payload = payloads.get(name)
            if payload is None:
                body = {**call.chat, "model": self.config.pools[name].model}
                if stream is False:
                    body.pop("stream", None)
                    body.pop("stream_options", None)
                payload = payloads[name] = _json.encode(body)
            result = await self._open(call, name, payload, timeout_s)
            if isinstance(result, _Opened):
                return result
            refusals.append(result)
        overloaded = [r for r in refusals if r.status == 429]
        if overloaded:
            for name in pools:
                self.metrics.overloaded.labels(name).inc()
            raise overloaded[0]
        raise refusals[-1]

    async def _open(self, call: _Call, name: str, payload: bytes, timeout_s: float | None) -> _Opened | HTTPError:
        """One pool: a free replica, retried on the next one for failures before the first byte."""
        pool, config = self.router.pools[name], self.config.pools[name]
        path = UPSTREAM_PATH[call.api]
        tried: set[str] = set()
        last_error = ""
        while True:
            lease = pool.acquire(len(payload), text=call.choice.text, exclude=frozenset(tried))
            if isinstance(lease, Overloaded):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: {len(tried)} replica(s) failed ({last_error}) and "
                                     "the rest are at their in-flight cap")
                return HTTPError(429, f"{lease.reason}; retry after {lease.retry_after_s}s",
                                 code="overloaded", headers=[(b"retry-after", str(lease.retry_after_s).encode())])
            if isinstance(lease, NoReplica):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: every replica tried failed; last: {last_error}")
                return HTTPError(503, lease.reason, code="no_replica")
            if tried:
                self.metrics.retries.labels(name).inc()
            url = lease.replica.url
            tried.add(url)
            started = time.perf_counter()
            try:
                response = await self.upstream.open(url, path, payload, api_key=config.api_key,
                                                     timeout_s=min(config.timeout_s, timeout_s or config.timeout_s))
            except UpstreamError as exc:
                lease.release(False)
                self.metrics.upstream_errors.labels(name).inc()
                last_error = str(exc)
                log.warning("pool %s: %s; trying another replica", name, exc)
                continue
            except BaseException:
                lease.release(None)
                raise
            if lease.probe:
                # A half-open breaker closes at the head: the replica answers. Other requests count as
                # a success only when they end well, so responses that keep breaking off open it.
                lease.succeeded()
            self.metrics.upstream_latency.labels(name).observe(time.perf_counter() - started)
            return _Opened(response, lease, name, len(tried))

    async def _pass_through(self, call: _Call, response: Response, send: Send) -> bool:
        """Upstream bytes to the client: a stream as each piece arrives, a JSON body in one send once
        complete (it is useless to a client before then). False when upstream broke off."""
        content_type = response.content_type.encode()
        streaming = content_type.startswith(b"text/event-stream")
        try:
            if not streaming:
                body = await response.read()
                await self._start(call, send, 200, [(b"content-type", content_type),
                                                    (b"content-length", str(len(body)).encode())])
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return True
            await self._start(call, send, 200, [(b"content-type", content_type)])
            async for chunk in response.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except READ_ERRORS as exc:
            log.warning("upstream %s broke off a response: %s", response.url, exc)
            if call.status == 0:
                raise
            if streaming:
                error = {"error": {"message": f"upstream failed mid-stream: {type(exc).__name__}",
                                   "type": "upstream_error", "code": 502}}
                await send({"type": "http.response.body", "body": b"data: " + _json.encode(error) + b"\n\n",
                            "more_body": False})
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _adapt_stream(self, call: _Call, response: Response, send: Send) -> bool:
        """Upstream chat chunks as Responses or Messages events, translated as each arrives."""
        stream = _adapter_stream(call)
        await self._start(call, send, 200, _SSE)
        await send({"type": "http.response.body", "body": stream.start(), "more_body": True})
        done, reader = False, SSEData()

        async def translate(events: list[bytes]) -> None:
            """Send what translates; a bad event is raised after the good ones before it went out."""
            nonlocal done
            out, bad = [], None
            for data in events:
                if data.strip() == b"[DONE]":
                    done = True
                elif data.strip():
                    try:
                        out.append(_shaped(stream.feed, _decode_object(data)))
                    except UpstreamError as exc:
                        bad = exc
                        break
            if out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if bad is not None:
                raise bad

        try:
            async for chunk in response.chunks():
                await translate(reader.feed(chunk))
            await translate(reader.finish())
        except (*READ_ERRORS, UpstreamError) as exc:
            log.warning("upstream %s broke off a stream: %s", response.url, exc)
        ok = done  # a stream that ended without [DONE] (or was no event stream at all) broke off
        if done:
            tail = stream.finish()
        elif isinstance(stream, MessagesStream):
            tail = stream.error("api_error", "upstream ended the stream early")
        else:
            tail = stream.error("upstream ended the stream early")
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return ok

    async def _send_adapted(self, call: _Call, chat: dict[str, Any], send: Send) -> None:
        if call.api == "responses":
            body = _shaped(chat_to_response, chat, call.request)
        elif call.api == "messages":
            body = _shaped(chat_to_message, chat, call.request)
        else:
            body = chat
        if call.escalation is not None:
            body["router"] = call.escalation
        data = _json.encode(body)
        await self._start(call, send, 200, [*_JSON, (b"content-length", str(len(data)).encode())])
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _upstream_refusal(self, call: _Call, response: Response, send: Send) -> None:
        """A 4xx from upstream (bad request, unknown model there, ...): passed on in the API's shape."""
        raw = await response.read()
        if call.api != "messages":
            content_type = response.content_type.encode()
            await self._start(call, send, response.status, [(b"content-type", content_type)])
            await send({"type": "http.response.body", "body": raw, "more_body": False})
            return
        try:
            message = _decode.decode(raw)["error"]["message"]
        except (msgspec.DecodeError, KeyError, TypeError):
            message = raw[:500].decode(errors="replace")
        await self._start(call, send, response.status, _JSON)
        await send({"type": "http.response.body", "body": _json.encode(anthropic_error(response.status, message)),
                    "more_body": False})

    # ---- escalate ----

    async def _escalate(self, call: _Call, algorithm: EscalateAlgorithm, send: Send) -> None:
        """Stages in order, each answer judged whole; the first accepted one (or the last one got
        within the deadline and call cap) goes to the client, which is told which stage it was."""
        # The loop's clock, the one its timers fire by (uvloop's lags time.monotonic() a little).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + algorithm.deadline_s
        calls, answer, refusal = 0, None, None
        payloads: dict[str, bytes] = {}
        for stage in algorithm.stages:
            if calls >= algorithm.max_calls or loop.time() >= deadline:
                break
            calls += 1
            opened: _Opened | None = None
            outcome: bool | None = None  # for the replica's breaker: a passed deadline says nothing
            shared = asyncio.timeout_at(deadline)
            try:
                async with shared:
                    # The shared deadline is this timeout's: a shorter one inside would fail the stage
                    # a moment early and leave a sliver of time for the next stage to be called in.
                    opened = await self._open_any(call, (stage,), payloads, None, stream=False)
                    raw = await opened.response.read()
                status = opened.response.status
                completion = _decode_object(raw) if status == 200 else {}
                outcome = True
            except HTTPError as exc:
                refusal = exc
                log.info("escalate %s: stage %s refused: %s", call.choice.entry.name, stage, exc.message)
                continue
            except (*READ_ERRORS, UpstreamError) as exc:
                if shared.expired():  # the shared deadline, not the replica (its own read timeout is a failure)
                    refusal = HTTPError(504, f"stage {stage!r}: no answer within the {algorithm.deadline_s}s deadline")
                    continue
                outcome = False
                self.metrics.upstream_errors.labels(stage).inc()
                log.warning("escalate %s: stage %s failed: %s", call.choice.entry.name, stage, exc)
                refusal = HTTPError(502, f"stage {stage!r}: {exc}")
                continue
            finally:
                if opened is not None:
                    opened.response.close()
                    opened.lease.release(outcome)
            if status != 200:
                refusal = HTTPError(status if status < 500 else 502, f"stage {stage!r} answered HTTP {status}: "
                                    f"{raw[:300].decode(errors='replace')}")
                continue
            why = escalate.verdict(algorithm.accept, completion)
            answer = (stage, opened, completion, why)
            if why is None:
                break
            self.metrics.escalations.labels(call.choice.entry.name, stage).inc()
            log.info("escalate %s: stage %s not accepted: %s", call.choice.entry.name, stage, why)
        if answer is None:
            raise refusal or HTTPError(504, f"no stage answered within {algorithm.deadline_s}s")
        stage, opened, completion, why = answer
        call.headers += [(b"x-router-pool", stage.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode()),
                         (b"x-router-stage", stage.encode()), (b"x-router-calls", str(calls).encode()),
                         (b"x-router-accepted", b"true" if why is None else b"false")]
        call.escalation = {"stage": stage, "calls": calls, "accepted": why is None, "reason": why}
        try:
            await self._send_escalated(call, completion, send)
        except UpstreamError as exc:  # the answer's shape is not a completion's: the replica's fault
            raise HTTPError(502, f"stage {stage!r}: {exc}") from None

    async def _send_escalated(self, call: _Call, completion: dict[str, Any], send: Send) -> None:
        if not call.chat.get("stream"):
            await self._send_adapted(call, completion, send)
            return
        options = call.chat.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = _shaped(escalate.as_chunks, completion, chat=call.api != "completions", include_usage=usage)
        if call.api in ("chat", "completions"):
            body = b"".join(b"data: " + _json.encode(c) + b"\n\n" for c in chunks) + _DONE
            await self._start(call, send, 200, _SSE)
        else:
            stream = _adapter_stream(call)
            body = stream.start() + b"".join(_shaped(stream.feed, c) for c in chunks) + stream.finish()
            await self._start(call, send, 200, _SSE)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # ---- helpers ----

    def _choose(self, listener: ListenerConfig, chat: dict[str, Any]) -> Choice:
        served = self._entries[listener.name]
        model = chat.get("model")
        if model not in served:
            raise HTTPError(404, f"The model `{model}` does not exist; available: {', '.join(served)}",
                            param="model", code="model_not_found")
        try:
            return self.router.choose(chat)
        except UnknownModel as exc:
            raise HTTPError(404, str(exc), param="model", code="model_not_found") from None

    async def _start(self, call: _Call, send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        call.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers + call.headers})

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise HTTPError(413, f"request body is {int(value)} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _shaped(translate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An adapter's translation of an upstream answer; a chat body of another shape than chat's
    (choices that are not objects, say) is the replica's fault, not a crash of the router."""
    try:
        return translate(*args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise UpstreamError("upstream", f"answered a body that is not a chat completion: {exc!r}") from None


def _decode_object(raw: bytes) -> dict[str, Any]:
    """An upstream JSON body or chunk, which must be an object: anything else is the replica's fault."""
    try:
        value = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamError("upstream", f"answered invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UpstreamError("upstream", f"answered JSON that is not an object: {raw[:100]!r}")
    return value


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        raise HTTPError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    return body


def _adapt(translate: Callable[[dict[str, Any]], dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    try:
        return translate(body)
    except AdapterError as exc:
        raise HTTPError(400, str(exc), param=exc.param or None) from None


def _adapter_stream(call: _Call) -> ResponsesStream | MessagesStream:
    return ResponsesStream(call.request) if call.api == "responses" else MessagesStream(call.request)


def _error_body(api: str | None, exc: HTTPError) -> bytes:
    if api == "messages":
        return _json.encode(anthropic_error(exc.status, exc.message))
    return _json.encode({"error": {"message": exc.message, "type": _ERROR_TYPES.get(exc.status, "error"),
                                   "param": exc.param, "code": exc.code if exc.code is not None else exc.status}})


async def _send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], gone: asyncio.Event,
                            send: _Tracked) -> None:
    """A client leaving shows only as http.disconnect from receive(). uvicorn also returns it once the
    response is complete, which must not cancel the handler's remaining bookkeeping."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not send.complete:
                gone.set()
                task.cancel()
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
