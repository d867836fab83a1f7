"""Runs the router process: config, models for signals, health and DNS loops, hypercorn on every
listener's port."""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from services.router.app import RouterApp
from services.router.config import RouterConfig
from services.router.health import HealthChecker
from services.router.metrics import RouterMetrics
from services.router.routing import Router
from services.router.upstream import Upstream

log = logging.getLogger("router")


async def run(config: RouterConfig) -> int:
    router = Router(config)
    # Tokenizers and the embedding model load before the first request, never during one.
    await asyncio.to_thread(router.load_models)
    upstream = Upstream()
    checker = HealthChecker(config, router.pools, upstream)
    await checker.resolve_all()
    app = RouterApp(config, router, upstream, RouterMetrics(router.pools))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hc = HypercornConfig()
    hc.bind = [f"{listener.host}:{listener.port}" for listener in config.listeners]
    hc.backlog = 2048
    hc.accesslog = None
    hc.keep_alive_timeout = 75
    hc.graceful_timeout = 5
    checker.start()
    for listener in config.listeners:
        log.info("listener %s: http://%s:%d (%s; %s)", listener.name, listener.host, listener.port,
                 ", ".join(listener.apis), f"{len(listener.api_keys)} API key(s)" if listener.api_keys
                 else "no API keys: open")
    log.info("entries: %s; pools: %s", ", ".join(config.entries), ", ".join(
        f"{name} ({len(pool.replicas)} replicas)" for name, pool in router.pools.items()))
    try:
        await serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        await checker.stop()
        await upstream.close()
    return 0


def run_loop(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, a little slower
        return asyncio.run(coro)
    return uvloop.run(coro)
