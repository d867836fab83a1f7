"""Runs the router process, in either mode (modes.py): config, models for signals (in-process, and the model
runtime's workers), health and DNS loops, an HTTP server on every listener's port.

The server is uvicorn with the httptools parser, not hypercorn as in the frontend: the router's work
per request is small, so the server's own cost decides its added latency, and hypercorn + h11 cost
about twice the CPU per request (bench/router_latency.py; docs/router.md has the figures)."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Any

import uvicorn

from checkpoints import CheckpointError
from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from services.router.app import RouterApp
from services.router.backends.aiohttp_upstream import AiohttpUpstream
from services.router.backends.health import HealthChecker, pool_checks
from services.router.backends.kv_events import KvFeeds
from services.router.backends.pool import build_pools, load_models
from services.router.config import RouterConfig
from services.router.decision.engine import Router
from services.router.listeners.connections import uvicorn_protocol
from services.router.metrics import RouterMetrics
from services.router.modes import inactive_line, startup_line
from services.router.plugins.host import PluginHost
from services.router.plugins.registry import builder
from services.router.plugins.shared import Shared
from services.router.plugins.store.base import SchemaError, Store, StoreUnavailable
from services.router.plugins.store.factory import open_store
from services.router.runtime.deployments import Deployments

log = logging.getLogger("router")
_GC_YOUNG = 20_000  # allocations between young-generation passes of the collector (CPython: 700)


DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


async def run(config: RouterConfig, *, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
              max_connections: int = DEFAULT_MAX_CONNECTIONS, shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
              inactive: RouterConfig | None = None) -> int:
    """Serve `config` until SIGTERM or SIGINT, then let the requests running finish for `shutdown_timeout_s`
    (uvicorn's graceful shutdown: no new connection meanwhile; a lane stream, no task of uvicorn's, holds its
    connection open, which uvicorn waits on too); `inactive`: engine mode's routing file, loaded and not served."""
    if inactive is not None:
        log.info("%s", inactive_line(inactive))
    upstream = AiohttpUpstream()
    runtime = Deployments(config, upstream)  # the decision models: workers of the deployments signals use
    router = Router(config, models=runtime)
    pools = build_pools(config)
    # Tokenizers, chat templates and the embedding model load before the first request, never during one.
    await asyncio.to_thread(router.load_models)
    await asyncio.to_thread(load_models, config, pools)
    checker = HealthChecker(pool_checks(config, pools), upstream)
    await checker.resolve_all()
    store: Store | None = None
    if config.store is not None:  # the plugins' and the Responses API's state: opened before serving, or no start
        try:
            store = open_store(config.store)
            await store.open()
        except (StoreUnavailable, SchemaError, ValueError) as exc:
            log.error("cannot open the store (%s): %s", config.store.backend, exc)
            await upstream.close()
            return 2
    shared = Shared(config, store, runtime) if store is not None else None
    metrics = RouterMetrics(pools, shared.knowledge if shared is not None else None)  # the bases, read at scrape
    host = PluginHost(config, builder(shared), metrics) if shared is not None else None
    app = RouterApp(config, router, pools, upstream, metrics, body_timeout_s=header_timeout_s,
                    runtime=runtime, plugins=host or None, store=store)
    await app.bodies.warm()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runtime.start()
    except CheckpointError as exc:
        log.error("cannot start the model runtime: %s", exc)
        await runtime.stop()
        await upstream.close()
        if store is not None:
            await store.close()
        app.close()
        return 2
    if host:
        await host.start()  # a knowledge base's indexing, in the background: it embeds once the runtime is ready
    # Served meanwhile: /health answers at once, /ready once every used deployment has a ready worker
    # and the signals' examples are embedded (through those workers) rather than on a first request.
    app.warm = False

    async def prepare() -> None:
        await runtime.wait_ready()
        try:
            await router.warm()
        except Exception:  # warming is ahead-of-time work only: the examples are embedded on first use
            log.exception("signal examples not embedded ahead of requests")
        app.warm = True

    runtime_ready: asyncio.Task[None] | None = None
    if runtime.started:
        runtime_ready = loop.create_task(prepare())
        runtime_ready.add_done_callback(log_start_failure)
    else:  # nothing to wait for: warm before serving, as a router without deployments always has
        await prepare()
    # Everything made so far (config, tokenizers, models, modules, the app) lives as long as the process:
    # kept out of the collector's passes, which otherwise walk it again on every generation-2 pass that
    # request traffic triggers. And a relayed request allocates hundreds of tracked objects, nearly all
    # freed by their counts: at CPython's default of 700 a young pass ran every few requests, walking
    # every in-flight request's state each time (~5% of the router's event-loop CPU at 64 streams,
    # py-spy). Cyclic garbage waits longer; none is kept. The frontend's server does the same.
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])
    # httptools, with both bounds (listeners/connections.py), offering the lane its requests (listeners/lane.py)
    http = uvicorn_protocol(header_timeout_s, max_connections, app.lane)
    # proxy_headers off: nothing here reads the client's address or scheme from the scope, so uvicorn's
    # X-Forwarded-* middleware would be a layer of work per request for no reader (the frontend's likewise).
    servers = [uvicorn.Server(uvicorn.Config(app, host=listener.host, port=listener.port, http=http,
                                             loop="none", lifespan="off", access_log=False, log_config=None,
                                             proxy_headers=False, timeout_keep_alive=75,
                                             # typed int by uvicorn; asyncio.timeout takes the float
                                             timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
                                             backlog=2048))
               for listener in config.listeners]
    feeds = KvFeeds(config, pools)  # precise_prefix pools' KV event streams
    checker.on_replaced = feeds.sync
    checker.start()
    feeds.start()
    for listener in config.listeners:
        log.info("listener %s: http://%s:%d (%s; %s)", listener.name, listener.host, listener.port,
                 ", ".join(listener.apis), f"{len(listener.api_keys)} API key(s)" if listener.api_keys
                 else "no API keys: open")
    log.info("%s", startup_line(config, {name: len(pool.replicas) for name, pool in pools.items()}))

    async def stopper() -> None:
        # uvicorn catches SIGTERM/SIGINT itself while it serves and passes them on when it returns;
        # this handler, installed first, stops every listener's server either way.
        await stop.wait()
        for server in servers:
            server.should_exit = True

    stop_task = loop.create_task(stopper())
    quiet = _QuietCut()
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        stop_task.cancel()
        if runtime_ready is not None:
            runtime_ready.cancel()
        if host:
            await host.stop()  # response hooks in flight finish (bounded), then each plugin stops
        if store is not None:
            await store.close()
        await runtime.stop()  # its managed workers, before the router exits: none is left behind
        await checker.stop()
        await feeds.stop()
        await upstream.close()
        app.close()
    return 0


class _QuietCut(logging.Filter):
    """uvicorn logs each request task it cancels at the end of --shutdown-timeout as "Exception in ASGI
    application" with the CancelledError's traceback: a stream in a rollout is not a fault (uvicorn's own
    "Cancel N running task(s)" line says how many were cut). Any other exception is logged as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def log_start_failure(task: asyncio.Task[None]) -> None:
    """A background start task that failed says so (else /ready stays 503 with nothing in the log)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("the model runtime's start failed: the router stays not ready", exc_info=exc)


def run_loop(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, a little slower
        return asyncio.run(coro)
    return uvloop.run(coro)
