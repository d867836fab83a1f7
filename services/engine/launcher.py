"""Runs engine ranks: one rank in this process, or one spawned process per local rank, supervised."""
from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event

import zmq

import tracing
from services.engine.config import EngineConfig, is_loopback

log = logging.getLogger("engine")


def run_rank(config: EngineConfig, on_ready: Callable[[], None] | None = None) -> int:
    """One rank in this process: sockets bound first (a taken port fails at once, not after the
    model has loaded), then the backend, then the core loop. SIGTERM/SIGINT drain it. `on_ready`:
    called once it serves (the supervisor's sign that a later exit is a death, not a failed start)."""
    started = time.monotonic()
    # Before the backend: vLLM's own spans (its model preparation) go to the global provider set here.
    tracing.configure("engine", config.otlp_traces_endpoint, global_provider=True)
    try:
        return _run_rank(config, on_ready, started)
    finally:
        tracing.shutdown()  # the spans still batched are exported before the rank exits


def _run_rank(config: EngineConfig, on_ready: Callable[[], None] | None, started: float) -> int:
    from services.engine.bridge import BindError, Bridge
    from services.engine.core import CoreLoop
    from services.engine.wiring import build_backend

    if config.auth_token is None and not is_loopback(config.host):
        log.warning("rank %d listens on %s with no handshake token (--insecure-no-auth-token): any host that "
                    "reaches port %d can pause or abort generation, load adapters and push weights",
                    config.rank, config.host, config.port)
    ctx = zmq.Context()
    pub = "*" if config.pub_port is None else str(config.pub_port)  # "*": the OS picks a free port
    try:
        bridge = Bridge(ctx, f"tcp://{config.host}:{config.port}", f"tcp://{config.host}:{pub}",
                        beat_interval_s=config.heartbeat_interval_s, stall_timeout_s=config.stall_timeout_s)
    except BindError as exc:
        log.error("rank %d cannot start: %s", config.rank, exc)
        ctx.term()
        return 1
    try:
        try:
            backend, vocab_size = build_backend(config)
        except ValueError as exc:  # bad flags or checkpoint: say so plainly, no traceback
            log.error("rank %d cannot start: %s", config.rank, exc)
            return 2
        core = CoreLoop(config, backend, bridge, vocab_size=vocab_size)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: core.request_drain())
        info = backend.info
        log.info("rank %d ready in %.1fs: backend=%s model=%s runner=%s tasks=%s max_model_len=%d kv_blocks=%d "
                 "router=tcp://%s:%d pub=tcp://%s:%d epoch=%s handshake token %s", config.rank,
                 time.monotonic() - started, info.name, info.model, info.runner, ",".join(info.tasks),
                 info.max_model_len, info.num_kv_blocks,
                 config.host, config.port, config.host, bridge.pub_port, core.epoch,
                 "required" if config.auth_token else "not asked")
        if on_ready is not None:
            on_ready()
        return core.run()
    finally:
        bridge.close()
        ctx.term()


def _rank_process(config: EngineConfig, ready: Event) -> None:
    tracing.dump_stacks_on_usr1()
    setup_logging()
    sys.exit(run_rank(config, ready.set))


RESTART_WINDOW_S = 600.0  # restarts of one rank are counted over this window
RESTART_DELAY_MAX_S = 30.0
BAD_FLAGS = 2  # run_rank's exit code for bad flags or a bad checkpoint: starting again cannot help


def supervise(config: EngineConfig) -> int:
    """One process per local rank; a signal is passed on. A rank that dies after it was ready
    (killed, crashed) is started again on its ports while the other ranks keep serving: frontends
    fail its streams, place new work on the others and take it back when it handshakes. A rank that
    fails to start the first time, has bad flags, or dies more than --max-rank-restarts times within
    RESTART_WINDOW_S stops the whole unit, so the deployment's supervisor sees it fail rather than a
    unit serving on fewer ranks for good. The unit's exit code is then that rank's, as a shell
    reports it: 1 (or 2 for bad flags), or 128 + N for a rank killed by signal N."""
    ctx = multiprocessing.get_context("spawn")
    configs = [config.for_local_rank(i) for i in range(config.data_parallel_size_local)]
    ready = [ctx.Event() for _ in configs]  # set by a rank once it serves, for its first start
    procs: list[multiprocessing.process.BaseProcess | None] = [None] * len(configs)
    restarts: list[list[float]] = [[] for _ in configs]  # when each rank was started again
    due: dict[int, float] = {}  # rank index -> when to start it again
    stopping = False

    def start(i: int) -> None:
        p = ctx.Process(target=_rank_process, args=(configs[i], ready[i]), name=f"engine-rank-{configs[i].rank}")
        p.start()
        procs[i] = p
        if stopping:  # a signal while it started found procs[i] without it: it is told here instead
            p.terminate()

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        due.clear()
        for p in procs:
            if p is not None and p.is_alive() and p.pid is not None:
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(len(configs)):
        if not stopping:
            start(i)
    code = 0
    while due or any(p is not None and p.is_alive() for p in procs):
        for i, p in enumerate(procs):
            if p is None:
                continue
            p.join(timeout=0.2)
            if p.is_alive() or stopping or p.exitcode is None:
                continue
            procs[i] = None
            if p.exitcode == 0:
                log.warning("%s drained and exited; the other ranks keep serving", p.name)
                continue
            how = f"was killed by {signal.Signals(-p.exitcode).name}" if p.exitcode < 0 else f"exited with {p.exitcode}"
            now = time.monotonic()
            recent = restarts[i] = [t for t in restarts[i] if now - t < RESTART_WINDOW_S]
            if p.exitcode == BAD_FLAGS or not (ready[i].is_set() or recent) or len(recent) >= config.max_rank_restarts:
                code = exit_status(p.exitcode)
                why = (f"{len(recent)} restart(s) within {RESTART_WINDOW_S:.0f}s already" if recent
                       else "--max-rank-restarts 0" if ready[i].is_set() else "it did not start")
                log.error("%s %s; stopping the other ranks (exit code %d): %s", p.name, how, code, why)
                stop()
                break
            delay = 0.0 if not recent else min(RESTART_DELAY_MAX_S, 2.0 ** (len(recent) - 1))
            log.error("%s %s; starting it again in %.0fs (restart %d of at most %d within %.0fs); the other "
                      "ranks keep serving", p.name, how, delay, len(recent) + 1, config.max_rank_restarts,
                      RESTART_WINDOW_S)
            due[i] = now + delay
        now = time.monotonic()
        for i, at in list(due.items()):
            if at <= now and not stopping:
                due.pop(i, None)  # (a signal meanwhile clears `due`)
                restarts[i].append(now)
                start(i)
        if due and all(p is None for p in procs):
            time.sleep(0.2)  # every rank is waiting for its restart
    return code or max((exit_status(p.exitcode or 0) for p in procs if p is not None), default=0)


def exit_status(exitcode: int) -> int:
    """multiprocessing's exit code as a shell would give it: -N (killed by signal N) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
