"""Runs one frontend API server process: model files, engine connections, hypercorn."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import uuid

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from services.frontend.app import Frontend
from services.frontend.config import FrontendConfig
from services.frontend.engines import EngineSet
from services.frontend.managed import ManagedEngines
from services.frontend.metrics import Metrics
from services.frontend.model import Model

log = logging.getLogger("frontend")


async def run(config: FrontendConfig) -> int:
    model = Model.load(config.model, config.model_name)
    managed = None
    addresses = list(config.engine_addresses)
    if config.data_parallel_size_local > 0:
        managed = ManagedEngines(config)
        managed.start()
        addresses = managed.addresses
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
    hc.backlog = 2048  # hypercorn's default of 100 drops connections when hundreds arrive at once
    hc.accesslog = None
    hc.keep_alive_timeout = 75
    hc.graceful_timeout = 5
    code = 0

    async def startup() -> None:
        nonlocal code
        log.info("serving http://%s:%d (model %s); waiting for %d engine(s): %s", config.host, config.port,
                 config.model_name, len(addresses), ", ".join(addresses))
        try:
            await engines.wait_ready(config.handshake_timeout_s)
            log.info("all %d engine rank(s) ready", len(addresses))
        except TimeoutError as exc:
            log.error("%s", exc)
            code = 1
            stop.set()

    async def supervise_managed() -> None:
        nonlocal code
        while managed is not None and not stop.is_set():
            rc = managed.exited()
            if rc is not None:
                log.error("managed engines exited with %s; stopping", rc)
                code = 1
                stop.set()
            await asyncio.sleep(0.5)

    tasks = [loop.create_task(startup()), loop.create_task(supervise_managed())]
    try:
        await serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        for t in tasks:
            t.cancel()
        await engines.close()
        if managed is not None:
            await asyncio.to_thread(managed.stop)
    return code
