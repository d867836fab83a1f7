"""The router's app (one ASGI app for every listener, told apart by the port a request came in on), run
in the router process: the components assembled, routes and error framing; a generation request is
checked (listeners/access.py), parsed, translated by its API's codec (listeners/codecs/), routed by
the decision engine (decision/engine.py) or sent straight to a pool the listener publishes
(listeners/direct.py), and relayed to a pool (listeners/relay.py) or escalated
(listeners/escalate.py). The System One API answers from the decision models (listeners/systemone.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar, cast

import msgspec
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

import tracing
from edge.api_keys import KeyCheck
from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S
from services.router.backends.dispatch import Attempt, Dispatcher
from services.router.backends.fair_queue import Ticket
from services.router.backends.pool import NoReplica, Overloaded, Pool
from services.router.backends.upstream import Upstream
from services.router.config import EscalateAlgorithm, RouterConfig
from services.router.decision.decisions import NoEligibleDecision
from services.router.decision.engine import Choice, Router, UnknownModel
from services.router.decision.signals import request_text
from services.router.errors import HTTPError
from services.router.listeners.access import authorize
from services.router.listeners.asgi import (
    ClientGone,
    ResponseState,
    TrackedSend,
    lifespan,
    read_body,
    send_json,
    watch_disconnect,
)
from services.router.listeners.body_workers import BodyWorkers, Parsed, parse
from services.router.listeners.call import Call
from services.router.listeners.caller import Caller, caller_of
from services.router.listeners.codecs.codec import CHAT_PATH, Codec
from services.router.listeners.codecs.registry import CODECS, error_shape, output_of
from services.router.listeners.connections import cycle_of, on_client_gone
from services.router.listeners.direct import DirectPools
from services.router.listeners.escalate import Escalator
from services.router.listeners.json_body import BodyError
from services.router.listeners.lane import Lane
from services.router.listeners.limits import Charge, RateLimiter
from services.router.listeners.listener import Listener, listeners_by_port
from services.router.listeners.memory_api import MemoryAPI, memory_in_use, routed
from services.router.listeners.relay import Relay
from services.router.listeners.responses_api import API as STATE_API
from services.router.listeners.responses_api import Turn, is_state_path, responses_api
from services.router.listeners.systemone import MODELS_PATH, POST_PATHS, SystemOne
from services.router.metrics import RouterMetrics
from services.router.plugins.answer import Recorder
from services.router.plugins.hooks import Exchange, PluginRefusal
from services.router.plugins.host import Chain, PluginHost
from services.router.plugins.identity import tenant_of
from services.router.plugins.store.base import Store
from services.router.runtime.deployments import Deployments

log = logging.getLogger("router")
T = TypeVar("T")

POST_APIS = {**{codec.path: name for name, codec in CODECS.items()}, "/v1/router/explain": "explain",
             **dict.fromkeys(POST_PATHS, "systemone")}
GET_APIS = {"/v1/models": "models", MODELS_PATH: "systemone"}
_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
# Bodies larger than this are decoded and translated in a body worker process, and their rule signals
# evaluated in a thread: the event loop keeps serving every other stream meanwhile.
OFF_LOOP_BYTES = 256 << 10


class RouterApp:
    def __init__(self, config: RouterConfig, router: Router, pools: dict[str, Pool], upstream: Upstream,
                 metrics: RouterMetrics, *, max_body_bytes: int = 32 << 20, body_workers: int = 2,
                 body_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, runtime: Deployments | None = None,
                 plugins: PluginHost | None = None, store: Store | None = None) -> None:
        self.config = config
        self.router = router
        self.pools = pools
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s  # --header-timeout: a body's longest gap (edge.connection_limits)
        self.runtime = runtime  # the decision models' deployments: /ready waits for them
        # Cleared by the server until the signals' examples are embedded through the ready deployments.
        self.warm = True
        dispatcher = Dispatcher(config, pools, upstream, metrics)
        self.relay = Relay(dispatcher, metrics)
        self.escalator = Escalator(dispatcher, self.relay, metrics)
        self.judge = self.escalator.judge  # the LLM judge over the chat pools: both escalates ask it
        self.bodies = BodyWorkers(body_workers)
        self.direct = DirectPools(config)  # the pools listeners publish by name: called with no routing
        self.listeners_by_port = listeners_by_port(config)
        self._first = self.listeners_by_port[config.listeners[0].port]
        self._created = int(time.time())
        self.systemone = SystemOne(config, self._created)
        self.plugins = plugins  # the hooks' plugins (plugins/host.py); None: the config has none
        self.memory = MemoryAPI(store, memory_in_use(config))  # GET/DELETE /v1/memory: the memory plugin's
        # The Responses API's state: in the opened store, when the config keeps it (store.responses).
        self.responses = responses_api(config.store, store, metrics)
        self.limits = RateLimiter(config, metrics, store)  # tenants' and users' requests and tokens per minute
        # The plain streamed requests' way with no ASGI task (listeners/lane.py); the server's protocol asks it.
        self.lane = Lane(self, upstream, OFF_LOOP_BYTES)

    def close(self) -> None:
        """The body workers stopped (at shutdown)."""
        self.bodies.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        server = scope.get("server")
        listener = self.listeners_by_port.get(server[1] if server else -1, self._first)
        path, method = scope["path"], scope["method"]
        api = (POST_APIS.get(path) or GET_APIS.get(path) or ("memory" if routed(path) else None)
               or (STATE_API if is_state_path(path) else None))
        tracked = TrackedSend(send)
        await self._guarded(listener, api, method, path, tracked, self._route(listener, api, scope, receive, tracked))

    async def _guarded(self, listener: Listener, api: str | None, method: str, path: str, tracked: TrackedSend,
                       work: Awaitable[None]) -> None:
        """`work` (a request's handling) with its failures answered: an HTTPError in the API's error shape,
        a bug as a 500, either cut short once the response has started."""
        try:
            await work
        except HTTPError as exc:
            if not exc.counted:
                self.metrics.requests.labels(listener.name, api or "other", str(exc.status)).inc()
            if tracked.state is ResponseState.NOT_STARTED:
                await send_json(tracked, exc.status, _error_body(api, exc), exc.headers)
            else:  # too late for a status: end what was sent
                log.warning("%s %s failed after its response started: %s", method, path, exc.message)
                await tracked.end()
        except ClientGone:
            pass
        except Exception as exc:
            # A bug, or an upstream answer no branch expected: the client still gets an error in its API's shape.
            log.exception("%s %s failed", method, path)
            if not tracked.counted:
                self.metrics.requests.labels(listener.name, api or "other", "500").inc()
            if tracked.state is ResponseState.NOT_STARTED:
                error = HTTPError(500, f"internal error: {type(exc).__name__}")
                await send_json(tracked, 500, _error_body(api, error))
            else:
                await tracked.end()

    async def _route(self, listener: Listener, api: str | None, scope: Scope, receive: Receive,
                     send: TrackedSend) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/health":
            _only_get(path, method)
            await send_json(send, 200, _json.encode(self._health()))
            return
        if path == "/ready":  # open like /health: probes carry no key (the detail needs one, below)
            _only_get(path, method)
            ready, body = self._ready(listener.keys.check(scope["headers"]) is KeyCheck.ACCEPTED)
            await send_json(send, 200 if ready else 503, _json.encode(body))
            return
        authorize(listener.keys, scope["headers"])
        if path == "/metrics":
            _only_get(path, method)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]})
            await send({"type": "http.response.body", "body": self.metrics.render()})
            return
        if path == "/openapi.json":
            _only_get(path, method)
            await send_json(send, 200, listener.openapi)
            return
        if api == STATE_API:  # /v1/responses/{id} and /v1/conversations, where the listener serves `responses`
            await self.responses.serve(listener, scope, send, lambda: read_body(
                scope, receive, self.max_body_bytes, self.body_timeout_s))
            return
        # An API's other routes (count_tokens) are served where the API is.
        codec = CODECS.get(api) if api is not None else None
        served = codec.part_of or api if codec is not None else api
        if api is None or served not in listener.config.apis:
            raise HTTPError(404, f"no route for {method} {path} on listener {listener.name!r}")
        if api == "memory":
            answer = await self.memory.answer(method, path, scope["query_string"], scope["headers"],
                                              bool(listener.keys))
            self.metrics.requests.labels(listener.name, api, "200").inc()
            send.counted = True
            await send_json(send, 200, answer)
            return
        if path in GET_APIS:
            _only_get(path, method)
        elif method != "POST":
            raise HTTPError(405, f"{path} accepts POST only", headers=[(b"allow", b"POST")])
        if api == "models":
            await send_json(send, 200, _json.encode(self._models(listener)))
        elif api == "systemone":
            await self._systemone(listener, path, scope, receive, send)
        elif api == "explain":
            raw = await read_body(scope, receive, self.max_body_bytes, self.body_timeout_s)
            await send_json(send, 200, _json.encode(await self._explain(listener, await self._parse(api, raw),
                                                                          len(raw))))
        else:
            assert codec is not None  # every other POST route is a codec's
            await self._traced(listener, codec, scope, receive, send)

    # ---- plain routes ----

    def _health(self) -> dict[str, Any]:
        return {"status": "ok", "pools": {name: {"ready": sum(1 for r in pool.snapshot() if r["ready"]),
                                                 "replicas": len(pool.replicas)}
                                          for name, pool in self.pools.items()}}

    def _ready(self, detail: bool) -> tuple[bool, dict[str, Any]]:
        """Ready once every deployment the config uses has had a ready worker (none used: at once), so
        no first request waits on a model load. Ready stays ready after: a deployment with no worker
        ready now makes its signals unknown, not the router unable to route, so it is `degraded`, still
        200 (a 503 would take the router out of its Service). `detail` (the listener's key, like
        /metrics): each deployment's workers, whose addresses an open probe must not see."""
        if self.runtime is None:
            return True, {"status": "ready", **({"deployments": {}} if detail else {})}
        started, down, deployments = self.runtime.readiness()
        ready = started and self.warm
        status = "starting" if not ready else "degraded" if down else "ready"
        body: dict[str, Any] = {"status": status}
        if detail:
            body.update(deployments=deployments, **({"degraded": down} if down else {}))
        return ready, body

    def _models(self, listener: Listener) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": self._created,
                                            "owned_by": "router"} for name in _public_names(listener)]}

    async def _systemone(self, listener: Listener, path: str, scope: Scope, receive: Receive,
                         send: TrackedSend) -> None:
        if path == MODELS_PATH:
            body: bytes | None = self.systemone.models(listener)
        else:
            raw = await read_body(scope, receive, self.max_body_bytes, self.body_timeout_s)
            request = self.systemone.resolve(listener, raw)
            body = await _unless_gone(receive, send, self.systemone.answer(
                request, runtime=self.runtime, router=self.router, judge=self.judge,
                offload=len(raw) > OFF_LOOP_BYTES))
        self.metrics.requests.labels(listener.name, "systemone", "200" if body is not None else "499").inc()
        send.counted = True
        if body is not None:
            await send_json(send, 200, body)

    async def _parse(self, api: str, raw: bytes) -> Parsed:
        """The body read for routing: a long one in a body worker, off the event loop; 400 naming the field."""
        try:
            return await self.bodies.parse(api, raw) if len(raw) > OFF_LOOP_BYTES else parse(api, raw)
        except BodyError as exc:
            raise HTTPError(400, exc.message, param=exc.param or None) from None

    async def _explain(self, listener: Listener, parsed: Parsed, size: int) -> dict[str, Any]:
        chat = parsed.chat
        choice = await self._choose(listener, chat, parsed.text, offload=size > OFF_LOOP_BYTES)
        out = choice.describe()
        for name in choice.plan:
            pool = self.pools[name]
            body = chat
            if parsed.bulk and pool.policy.reads_body:  # precise_prefix renders the messages: it needs them whole
                body = {**chat, **await asyncio.to_thread(_decode.decode, parsed.bulk)}
            picked = pool.preview(size, text=choice.text, prepared=await pool.prepare(body, size))
            out["pool"] = name
            out["replicas"] = pool.snapshot()
            if isinstance(picked, Overloaded):
                out.update(replica=None, status="overloaded", reason=picked.reason)
            elif isinstance(picked, NoReplica):
                out.update(replica=None, status="no_replica", reason=picked.reason)
            else:
                out.update(replica=picked.url, status="ok", reason=pool.policy.last_reason)
                break
            if isinstance(choice.entry.algorithm, EscalateAlgorithm):
                break  # escalate always starts at its first stage
        return out

    # ---- generation ----

    async def _traced(self, listener: Listener, codec: Codec, scope: Scope, receive: Receive,
                      send: TrackedSend) -> None:
        """A generation request in its trace's server span (continuing a client's `traceparent`)."""
        if not tracing.enabled():
            tracing.pass_through(scope["headers"])  # a client's trace goes on through the replicas
        with tracing.server_span("router.request", scope["headers"], {
                "http.route": scope["path"], "router.listener": listener.name}) as span:
            try:
                await self._generate(listener, codec, scope, receive, send)
            except HTTPError as exc:
                tracing.annotate(span, {"http.response.status_code": exc.status})
                if exc.status >= 500:
                    tracing.fail(span, exc.message)
                raise
            except Exception as exc:
                tracing.fail(span, f"{type(exc).__name__}: {exc}")
                raise

    async def _generate(self, listener: Listener, codec: Codec, scope: Scope, receive: Receive,
                        send: TrackedSend) -> None:
        raw = await read_body(scope, receive, self.max_body_bytes, self.body_timeout_s)
        parsed = await self._parse(codec.name, raw)
        caller = caller_of(listener.config, self.config.admission, scope["headers"], parsed.request)  # 400, 403
        turn = await self.responses.begin(listener, codec, parsed, len(raw), scope)  # previous_response_id, store
        chat = parsed.chat
        # Counting the tokens of a long text would stall every stream: that goes to a thread.
        choice = await self._choose(listener, chat, parsed.text, offload=len(raw) > OFF_LOOP_BYTES,
                                    output=output_of(codec.name))
        if not codec.judged:
            # No answer to judge or to learn from (a token count): the cache-aware policy is not told the text.
            choice = replace(choice, text="")
        call = Call(listener.config, codec, parsed.request, chat, choice, bulk=parsed.bulk,
                    ticket=Ticket.of(self.config.admission, caller.tenant, caller.priority))
        call.headers = [(b"x-router-entry", choice.entry.name.encode()),
                        (b"x-router-decision", choice.decision.name.encode())]
        self.count(choice)
        charge = None  # what the rate limits charged it, settled when it ends
        if not codec.part_of and self.limits.applies(listener.config):  # count_tokens generates nothing
            charge = await self.limits.admit(listener.config, caller, chat, parsed.text, headers=call.headers)
            call.usage = charge.usage if charge is not None else None
        chain: Chain = ()
        if self.plugins and codec.judged:  # a token count has no answer to keep or recall for
            chain = self.plugins.plugins_for(choice.entry, choice.decision.name, choice.decision.matched_default)
        await self._relayed(listener, codec, call, scope, receive, send, caller, chain, charge, turn)

    async def handed(self, listener: Listener, call: Call, cycle: RequestResponseCycle, first: Attempt) -> None:
        """A lane request handed over at its first attempt's head (listeners/lane.py): answered from there
        by the ASGI path's code, through the cycle's own send, as a request task of uvicorn's would be."""
        scope, codec = cast(Scope, cycle.scope), call.codec
        tracing.pass_through(scope["headers"])  # tracing is off on the lane: a client's trace still goes on
        tracked = TrackedSend(cast(Send, cycle.send))
        await self._guarded(listener, codec.name, scope["method"], scope["path"], tracked, self._relayed(
            listener, codec, call, scope, cast(Receive, cycle.receive), tracked, None, first=first))
        if not cycle.response_complete and not cycle.disconnected:
            cycle.transport.close()  # as uvicorn does after an app that left its response unfinished

    async def _relayed(self, listener: Listener, codec: Codec, call: Call, scope: Scope, receive: Receive,
                       send: TrackedSend, caller: Caller | None, chain: Chain = (), charge: Charge | None = None,
                       turn: Turn | None = None, first: Attempt | None = None) -> None:
        """A routed call answered: its request hooks, then a hook's answer, escalation or the relay (its
        first attempt made already: `first`), the client's leaving watched, the bookkeeping at the end."""
        task = asyncio.current_task()
        assert task is not None  # a request is always handled in a task
        gone = asyncio.Event()
        # Under this router's uvicorn protocol the connection says when the client leaves; elsewhere a
        # task watches receive() for it.
        cycle = cycle_of(receive)
        watcher = None
        if cycle is None or not on_client_gone(cycle, _leaving(task, gone, send)):
            watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task, gone, send))
        elif cycle.disconnected:  # it left before its task ran (a lane hand-over's, say): nothing would tell it
            _leaving(task, gone, send)()
        exchange: Exchange | None = None
        answered: dict[str, Any] | None = None
        ran = 0  # the plugins whose request hook ran: their response hooks run
        answering = self.responses.sending(turn, send)  # a stored response is stored before its last piece
        try:
            if chain:
                assert caller is not None  # a chain runs only on the ASGI path, which has the caller
                exchange = await self._exchange(listener, codec, call, scope, caller)
                answered, ran = await self._hooks(chain, exchange)
                call.headers += exchange.headers
            if answered is not None:
                await self.relay.send_whole(call, answered, answering)
            elif isinstance(call.choice.entry.algorithm, EscalateAlgorithm) and codec.judged:
                await self.escalator.escalate(call, call.choice.entry.algorithm, answering)
            else:
                await self.relay.relay(call, answering, first)
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
            task.uncancel()
            call.status = 499
        finally:
            if watcher is not None:
                watcher.cancel()
            elif cycle is not None:
                on_client_gone(cycle, None)
            if tracing.enabled():
                tracing.annotate(tracing.current(), {"http.response.status_code": call.status})
                if call.status >= 500:
                    tracing.fail(tracing.current(), f"answered {call.status}")
            self.metrics.requests_of(listener.name, codec.name, str(call.status)).inc()
            send.counted = True
            self.limits.settle(charge, status=call.status, started=send.state is not ResponseState.NOT_STARTED,
                               cached=answered is not None)
            if exchange is not None and ran and self.plugins is not None:
                answer = call.recorder.answer() if call.recorder is not None and call.status == 200 else None
                by = chain[ran - 1][1].name if answered is not None else None
                self.plugins.respond(chain[:ran], exchange, answer, by)

    async def _exchange(self, listener: Listener, codec: Codec, call: Call, scope: Scope,
                        caller: Caller) -> Exchange:
        """The request as its plugins see it. They read and add to the messages: a long body's, left in a
        body worker to route, are decoded here (in a thread). The upstream body becomes a copy of its own,
        so that what hooks add never shows in the client's request."""
        chat = dict(call.chat)
        if call.bulk:
            chat.update(await asyncio.to_thread(_decode.decode, call.bulk))
            call.bulk = b""
        call.chat = chat
        call.recorder = Recorder(chat=codec.upstream_path == CHAT_PATH)
        return Exchange(codec.name, codec.upstream_path == CHAT_PATH, call.choice.entry.name,
                        call.choice.decision.name, call.request, chat,
                        tenant_of(bool(listener.keys), scope["headers"]), caller.user)

    async def _hooks(self, chain: Chain, exchange: Exchange) -> tuple[dict[str, Any] | None, int]:
        assert self.plugins is not None  # a chain is only ever built from the host
        try:
            return await self.plugins.request(chain, exchange)
        except PluginRefusal as exc:
            raise HTTPError(exc.status, exc.message) from None

    def count(self, choice: Choice) -> None:
        entry = choice.entry.name
        self.metrics.decisions_of(entry, choice.decision.name).inc()
        for name, result in choice.signals.items():
            outcome = "unknown" if result.unknown else "matched" if result.matched else "unmatched"
            self.metrics.signal_results.labels(entry, name, outcome).inc()
        if choice.models_s is not None:
            self.metrics.signal_latency.labels(entry).observe(choice.models_s)

    async def _choose(self, listener: Listener, chat: dict[str, Any], text: str | None = None, *,
                      offload: bool = False, output: str = "text") -> Choice:
        """The served entry's routing, or a published pool's direct Choice (an entry of the same name
        comes first: publishing a pool never bypasses a recipe). `output`: what the request needs
        produced (text; image for the Images API): 400 when the model leads to no pool that declares it."""
        model = chat.get("model")
        try:
            if model not in listener.entries:
                with tracing.span("router.decision", {"router.direct": True}) as span:
                    direct = self.direct.choose(listener.config, model,
                                                request_text(chat) if text is None else text, output)
                    if span is not None and direct is not None:
                        span.set_attribute("router.plan", list(direct.plan))
                if direct is None:
                    raise HTTPError(404, f"The model `{model}` does not exist; available: "
                                    f"{', '.join(_public_names(listener))}", param="model")
                return direct
            return await self.router.choose(chat, text, offload=offload, outputs=output)
        except UnknownModel as exc:
            raise HTTPError(404, str(exc), param="model") from None
        except NoEligibleDecision:
            why = (f"the pool's `outputs` lack {output!r}" if model not in listener.entries else
                   f"no decision (nor the default) has candidate pools that all declare {output!r} in their `outputs`")
            raise HTTPError(400, f"The model `{model}` routes to no {output}-output pool: {why}",
                            param="model") from None


def _public_names(listener: Listener) -> tuple[str, ...]:
    """What a listener serves by name: its entries, then the pools it publishes (/v1/models' order)."""
    return listener.entries + tuple(name for name in listener.config.pools if name not in listener.entries)


async def _unless_gone(receive: Receive, send: TrackedSend, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None when the client left first: its calls (a recipe's stages, its judge) are
    cancelled then rather than run to their deadline for nobody."""
    task = asyncio.current_task()
    assert task is not None  # a request is always handled in a task
    gone = asyncio.Event()
    watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task, gone, send))
    try:
        return await work
    except asyncio.CancelledError:
        if not gone.is_set():
            raise
        task.uncancel()
        return None
    finally:
        watcher.cancel()


def _leaving(task: asyncio.Task[Any], gone: asyncio.Event, send: TrackedSend) -> Callable[[], None]:
    """What the connection calls when the client leaves: the handler cancelled, as watch_disconnect
    does, unless its response went out whole (its remaining bookkeeping then runs)."""

    def left() -> None:
        if send.state is not ResponseState.COMPLETE:
            gone.set()
            task.cancel()

    return left


def _only_get(path: str, method: str) -> None:
    """The read-only routes answer GET and HEAD (uvicorn sends no body for HEAD), as the frontend's do."""
    if method not in ("GET", "HEAD"):
        raise HTTPError(405, f"{path} accepts GET and HEAD only", headers=[(b"allow", b"GET, HEAD")])


def _error_body(api: str | None, exc: HTTPError) -> bytes:
    return _json.encode(error_shape(api).error_body(exc.status, exc.message, exc.param))
