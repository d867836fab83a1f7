"""Runs one frontend API server process: model files, engine connections (none in render-only mode),
hypercorn, and the shutdown (SIGTERM or SIGINT: drain for --shutdown-timeout, then stop; shutdown.py)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import uvicorn
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

import tracing
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.grpc_api.in_flight import InFlightBoard
from services.frontend.http_api.app import Frontend
from services.frontend.http_api.connections import guard_hypercorn, uvicorn_protocol
from services.frontend.managed import ManagedEngines
from services.frontend.model import Model
from services.frontend.parsers.harmony import tokenizer_problem

log = logging.getLogger("frontend")
_GC_YOUNG = 20_000  # allocations between young-generation passes of the collector (CPython: 700)


async def run(config: FrontendConfig, server_index: int = 0, board: InFlightBoard | None = None) -> int:
    """One API server process. Server 0 also starts managed engines and the other API servers, which
    bind the same port (SO_REUSEPORT: the kernel spreads connections) with their own engine links.
    `board`: with gRPC and several API servers, where the others publish their requests in flight."""
    model = Model.load(config.model, config.model_name)
    if config.harmony:
        problem = tokenizer_problem(model.tokenizer.token_to_id)
        if problem is not None:
            log.error("--tool-call-parser/--reasoning-parser %s: %s",
                      config.tool_call_parser or config.reasoning_parser, problem)
            return 1
    if config.render_only and (config.max_model_len or model.config_max_model_len) is None:
        log.error("--render-only: %s/config.json gives no context length (max_position_embeddings, ...); "
                  "set --max-model-len", model.path)
        return 1
    managed = None
    addresses = list(config.engine_addresses)
    if config.data_parallel_size_local > 0:
        if config.auth_token is None:  # loopback is reachable by every user of this host: a token anyway
            config = dataclasses.replace(config, auth_token=secrets.token_hex(32))
        managed = ManagedEngines(config)
        managed.start()
        addresses = managed.addresses
    if server_index == 0 and config.grpc_port and config.api_server_count > 1:
        board = InFlightBoard(multiprocessing.get_context("spawn"), config.api_server_count, len(addresses))
    siblings = _start_siblings(config, addresses, board) if server_index == 0 else []
    frontend_id = config.frontend_id or f"frontend-{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    engines = EngineSet(addresses, frontend_id=frontend_id, engine_timeout_s=config.engine_timeout_s,
                        heartbeat_interval_s=config.heartbeat_interval_s, auth_token=config.auth_token,
                        engine_dead_timeout_s=config.engine_dead_timeout_s)
    if not config.render_only:  # render-only: no engine, so no socket thread either
        engines.start()
    core = FrontendCore(config, model, engines, Metrics(config.model_name))
    app = Frontend(core)
    grpc_server = None
    if config.grpc_port and server_index == 0:
        from services.frontend.grpc_api.grpc_server import GrpcServer  # grpcio only where gRPC is served
        from services.frontend.grpc_api.kv_relay import KvRelay

        engines.relay = relay = KvRelay(lambda: [(e.rank, e.epoch, e.kv.blocks, e.block_size)
                                                 for e in engines.engines if e.state == "ready"])
        grpc_server = GrpcServer(core, relay, host=config.host, port=config.grpc_port, api_keys=config.api_keys,
                                 others_in_flight=functools.partial(board.others, 0) if board else lambda i: 0)
        try:
            await grpc_server.start()
        except OSError as exc:
            log.error("%s", exc)
            await engines.close()
            for p in siblings:
                p.terminate()
            if managed is not None:
                await asyncio.to_thread(managed.stop)
            return 1

    # Everything made so far (the model's tokenizer and tables, the modules, the app) lives as long as
    # the process: kept out of the collector's passes, which otherwise walk it again on every
    # generation-2 pass that request traffic triggers (as vLLM's API server does at start-up).
    gc.collect()
    gc.freeze()
    # A streamed request allocates thousands of tracked objects, nearly all freed by their counts: at the
    # default 700 a young pass ran several times a request, walking every stream's live state each time
    # (~12% of a short stream's event-loop CPU, measured). Cyclic garbage waits longer; none is kept.
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_cancellations)
    quit_ = asyncio.Event()  # shut down: drain first
    now = asyncio.Event()  # end running requests at once (a second signal, or nothing left to serve)
    stop = asyncio.Event()  # hypercorn's trigger, once drained

    told = False  # the other API servers know: they drain on their own, at the same time

    def tell_siblings() -> None:
        nonlocal told
        if not told:
            told = True
            for p in siblings:
                if p.is_alive():
                    p.terminate()

    def on_signal(sig: signal.Signals) -> None:
        nonlocal told
        if quit_.is_set():
            log.warning("%s again: ending running requests now", sig.name)
            now.set()
        quit_.set()
        if sig == signal.SIGINT:
            told = True  # a terminal's Ctrl-C reaches every process of the group by itself
        tell_siblings()

    def give_up() -> None:
        now.set()
        quit_.set()
        tell_siblings()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    hc = HypercornConfig()
    hc.bind = [f"{config.host}:{config.port}"]
    hc.workers = config.api_server_count  # > 1 makes hypercorn bind with SO_REUSEPORT
    hc.backlog = 2048  # hypercorn's default of 100 drops connections when hundreds arrive at once
    hc.accesslog = None
    hc.keep_alive_timeout = 75
    guard_hypercorn(config.header_timeout_s, config.connection_limit)
    # Requests are drained before hypercorn is told to stop (shutdown.py); this only bounds the close of
    # connections after that, and a response that a client stopped reading.
    hc.graceful_timeout = 3
    code = 0

    async def startup() -> None:
        nonlocal code
        if config.render_only:
            log.info("API server %d serving http://%s:%d (model %s), render-only: no engines, max_model_len %d",
                     server_index, config.host, config.port, config.model_name,
                     config.max_model_len or model.config_max_model_len)
            return
        log.info("API server %d serving http://%s:%d (model %s); waiting for %d engine(s): %s", server_index,
                 config.host, config.port, config.model_name, len(addresses), ", ".join(addresses))
        if grpc_server is not None:  # SERVING once some rank is ready, as /ready: not when the last one is
            loop.create_task(grpc_health(grpc_server))
        try:
            await engines.wait_ready(config.handshake_timeout_s)
            app.update_gauges()  # now, not at the next refresh: another process may answer the next scrape
            log.info("all %d engine rank(s) ready", len(addresses))
        except TimeoutError as exc:
            log.error("%s", exc)
            code = 1
            give_up()

    async def supervise_children() -> None:
        nonlocal code
        while not quit_.is_set():
            rc = managed.exited() if managed is not None else None
            dead = [p for p in siblings if not p.is_alive()]
            if rc is not None or dead:
                log.error("%s exited; stopping", "managed engines" if rc is not None else dead[0].name)
                code = 1
                give_up()
            elif engines.broken is not None:
                # Serving nothing but errors while looking alive helps nobody: exit for a restart.
                log.error("%s; stopping", engines.broken)
                code = 1
                give_up()
            await asyncio.sleep(1.0)

    async def grpc_health(server: Any) -> None:
        """The gRPC health service follows /ready: SERVING while some rank takes new requests."""
        serving = None
        while not quit_.is_set():
            change = engines.changed.wait()  # bound before the look: a change during set_serving wakes it
            ready = bool(engines.serving())
            if ready != serving:
                serving = ready
                await server.set_serving(ready)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change, 5.0)

    async def drain_then_stop() -> None:
        await quit_.wait()
        if grpc_server is not None:  # new calls refused, running ones drained with the HTTP ones
            grpc_server.relay.close()  # KV event streams end now: they never finish on their own
            grpc_task = loop.create_task(grpc_server.stop(0.0 if now.is_set() else config.shutdown_timeout_s))
        await core.shutdown.drain(0.0 if now.is_set() else config.shutdown_timeout_s, now)
        if grpc_server is not None:
            await grpc_task
        stop.set()

    async def refresh_gauges() -> None:
        while True:
            app.update_gauges()
            await asyncio.sleep(1.0)

    tasks = [loop.create_task(startup()), loop.create_task(supervise_children()),
             loop.create_task(drain_then_stop())]
    if board is not None and server_index > 0:  # for API server 0's gRPC GetLoads
        tasks.append(loop.create_task(board.keep_publishing(server_index,
                                                            lambda: [len(e.inflight) for e in engines.engines])))
    if config.api_server_count > 1:  # one process answers a scrape for all: the others keep theirs current
        tasks.append(loop.create_task(refresh_gauges()))
    try:
        # hypercorn types scopes and events as TypedDicts, starlette (whose types the app uses) as
        # MutableMapping; a TypedDict is not a MutableMapping to mypy, though both are ASGI dicts.
        if config.http_server == "uvicorn":
            await _serve_uvicorn(app, config, stop)
        elif config.http_server == "granian":
            await _serve_granian(app, config, stop)
        else:
            await serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        for t in tasks:
            t.cancel()
        core.close()
        await engines.close()
        tell_siblings()
        for p in siblings:
            await asyncio.to_thread(p.join, config.shutdown_timeout_s + 10)
            if p.is_alive():
                log.warning("%s did not stop; killing it", p.name)
                p.kill()
        if managed is not None:
            await asyncio.to_thread(managed.stop)
    return code


class _Uvicorn(uvicorn.Server):
    """uvicorn, with this process's own signal handling (run() drains first, then sets `stop`), and a
    main loop that ticks once a second (uvicorn's refreshes the Date header then) rather than ten
    times, and ends as soon as `stop` is set."""

    def __init__(self, config: uvicorn.Config, stop: asyncio.Event) -> None:
        super().__init__(config)
        self._stop = stop

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # a multiple of 10: each tick is a second's
            try:
                await asyncio.wait_for(self._stop.wait(), 1.0)
                self.should_exit = True
            except TimeoutError:
                pass


async def _serve_uvicorn(app: Frontend, config: FrontendConfig, stop: asyncio.Event) -> None:
    """The app under uvicorn with httptools on the listening socket made here: SO_REUSEPORT with several
    API servers, as hypercorn binds it; the same backlog, keep-alive and graceful close."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if config.api_server_count > 1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    http = uvicorn_protocol(config.header_timeout_s, config.connection_limit)  # httptools, both bounds added
    server = _Uvicorn(uvicorn.Config(app, http=http, ws="none", lifespan="off", interface="asgi3",
                                     access_log=False, log_config=None, proxy_headers=False, backlog=2048,
                                     timeout_keep_alive=75,
                                     timeout_graceful_shutdown=3), stop)
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()


async def _serve_granian(app: Frontend, config: FrontendConfig, stop: asyncio.Event) -> None:
    """The app under granian's embedded server (Rust HTTP on its own threads, the app on this loop); the
    `granian` extra (docs/frontend.md compares the servers). One API server process only: granian binds
    its own socket, without SO_REUSEPORT."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server

    # granian bounds headers itself (hyper's header_read_timeout: it closes without a 408, and it also
    # ends a keep-alive connection idle that long). It cannot bound its connections (config.py refuses
    # --max-connections with it): its backpressure counts requests.
    server = Server(app, address=config.host, port=config.port, interface=Interfaces.ASGI, http=HTTPModes.http1,
                    websockets=False, backlog=2048, log_enabled=False,
                    http1_settings=HTTP1Settings(header_read_timeout=int(config.header_timeout_s * 1000)))

    async def stop_when_told() -> None:
        await stop.wait()
        server.stop()

    watcher = asyncio.get_running_loop().create_task(stop_when_told())
    try:
        await server.serve()
    finally:
        watcher.cancel()


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: a CancelledError is how a task ends when it is cancelled, not an
    error. CPython 3.11's asyncio.streams re-raises it from the done-callback of each connection task
    that hypercorn cancels at its graceful timeout, one traceback per connection."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        log.debug("cancelled: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


def _start_siblings(config: FrontendConfig, addresses: list[str],
                    board: InFlightBoard | None) -> list[multiprocessing.process.BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    sibling = replace(config, data_parallel_size_local=0, engine_addresses=tuple(addresses))
    procs: list[multiprocessing.process.BaseProcess] = [
        ctx.Process(target=_sibling_main, args=(sibling, i, board), name=f"api-server-{i}")
        for i in range(1, config.api_server_count)]
    for p in procs:
        p.start()
    return procs


def _sibling_main(config: FrontendConfig, index: int, board: InFlightBoard | None) -> None:
    tracing.dump_stacks_on_usr1()
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s api-server-{index} %(name)s: %(message)s")
    tracing.configure("frontend", config.otlp_traces_endpoint)  # each API server exports its own spans
    try:
        code = run_loop(run(config, index, board))
    finally:
        tracing.shutdown()
    raise SystemExit(code)


def run_loop(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, a little slower
        return asyncio.run(coro)
    return uvloop.run(coro)
