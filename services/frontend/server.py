"""Runs one frontend API server process: model files, engine connections, hypercorn."""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import uuid
from dataclasses import replace
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from services.frontend.app import Frontend
from services.frontend.config import FrontendConfig
from services.frontend.engines import EngineSet
from services.frontend.managed import ManagedEngines
from services.frontend.metrics import Metrics
from services.frontend.model import Model
from services.frontend.parsers.harmony import tokenizer_problem

log = logging.getLogger("frontend")


async def run(config: FrontendConfig, server_index: int = 0) -> int:
    """One API server process. Server 0 also starts managed engines and the other API servers, which
    bind the same port (SO_REUSEPORT: the kernel spreads connections) with their own engine links."""
    model = Model.load(config.model, config.model_name)
    if config.harmony:
        problem = tokenizer_problem(model.tokenizer.token_to_id)
        if problem is not None:
            log.error("--tool-call-parser/--reasoning-parser %s: %s",
                      config.tool_call_parser or config.reasoning_parser, problem)
            return 1
    managed = None
    addresses = list(config.engine_addresses)
    if config.data_parallel_size_local > 0:
        managed = ManagedEngines(config)
        managed.start()
        addresses = managed.addresses
    siblings = _start_siblings(config, addresses) if server_index == 0 else []
    frontend_id = config.frontend_id or f"frontend-{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    engines = EngineSet(addresses, frontend_id=frontend_id, engine_timeout_s=config.engine_timeout_s,
                        heartbeat_interval_s=config.heartbeat_interval_s, auth_token=config.auth_token)
    engines.start()
    app = Frontend(config, model, engines, Metrics(config.model_name))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    hc = HypercornConfig()
    hc.bind = [f"{config.host}:{config.port}"]
    hc.workers = config.api_server_count  # > 1 makes hypercorn bind with SO_REUSEPORT
    hc.backlog = 2048  # hypercorn's default of 100 drops connections when hundreds arrive at once
    hc.accesslog = None
    hc.keep_alive_timeout = 75
    hc.graceful_timeout = 5
    code = 0

    async def startup() -> None:
        nonlocal code
        log.info("API server %d serving http://%s:%d (model %s); waiting for %d engine(s): %s", server_index,
                 config.host, config.port, config.model_name, len(addresses), ", ".join(addresses))
        try:
            await engines.wait_ready(config.handshake_timeout_s)
            log.info("all %d engine rank(s) ready", len(addresses))
        except TimeoutError as exc:
            log.error("%s", exc)
            code = 1
            stop.set()

    async def supervise_children() -> None:
        nonlocal code
        while not stop.is_set():
            rc = managed.exited() if managed is not None else None
            dead = [p for p in siblings if not p.is_alive()]
            if rc is not None or dead:
                log.error("%s exited; stopping", "managed engines" if rc is not None else dead[0].name)
                code = 1
                stop.set()
            elif engines.broken is not None:
                # Serving nothing but errors while looking alive helps nobody: exit for a restart.
                log.error("%s; stopping", engines.broken)
                code = 1
                stop.set()
            await asyncio.sleep(0.5)

    tasks = [loop.create_task(startup()), loop.create_task(supervise_children())]
    try:
        # hypercorn types scopes and events as TypedDicts, starlette (whose types the app uses) as
        # MutableMapping; a TypedDict is not a MutableMapping to mypy, though both are ASGI dicts.
        await serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        for t in tasks:
            t.cancel()
        app.translator.close()
        await engines.close()
        for p in siblings:
            p.terminate()
        for p in siblings:
            await asyncio.to_thread(p.join, 30)
        if managed is not None:
            await asyncio.to_thread(managed.stop)
    return code


def _start_siblings(config: FrontendConfig, addresses: list[str]) -> list[multiprocessing.process.BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    sibling = replace(config, data_parallel_size_local=0, engine_addresses=tuple(addresses))
    procs: list[multiprocessing.process.BaseProcess] = [
        ctx.Process(target=_sibling_main, args=(sibling, i), name=f"api-server-{i}")
        for i in range(1, config.api_server_count)]
    for p in procs:
        p.start()
    return procs


def _sibling_main(config: FrontendConfig, index: int) -> None:
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s api-server-{index} %(name)s: %(message)s")
    raise SystemExit(run_loop(run(config, index)))


def run_loop(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, a little slower
        return asyncio.run(coro)
    return uvloop.run(coro)
