"""Runs engine ranks: one rank in this process, or one spawned process per local rank, supervised."""
from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time

import zmq

from services.engine.config import EngineConfig

log = logging.getLogger("engine")


def run_rank(config: EngineConfig) -> int:
    """One rank in this process: sockets bound first (a taken port fails at once, not after the
    model has loaded), then the backend, then the core loop. SIGTERM/SIGINT drain it."""
    from services.engine.bridge import BindError, Bridge
    from services.engine.core import CoreLoop
    from services.engine.wiring import build_backend

    started = time.monotonic()
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
        log.info("rank %d ready in %.1fs: backend=%s model=%s max_model_len=%d kv_blocks=%d "
                 "router=tcp://%s:%d pub=tcp://%s:%d epoch=%s", config.rank, time.monotonic() - started,
                 info.name, info.model, info.max_model_len, info.num_kv_blocks, config.host, config.port,
                 config.host, bridge.pub_port, core.epoch)
        return core.run()
    finally:
        bridge.close()
        ctx.term()


def _rank_process(config: EngineConfig) -> None:
    setup_logging()
    sys.exit(run_rank(config))


def supervise(config: EngineConfig) -> int:
    """One process per local rank; a signal is passed on, and if one rank exits the rest are stopped
    so the deployment's supervisor restarts the whole unit rather than serving half of it silently.
    The unit's exit code is the first failed rank's, as a shell reports it: 1 (or 2 for bad flags),
    or 128 + N for a rank killed by signal N."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_process, args=(config.for_local_rank(i),),
                         name=f"engine-rank-{config.data_parallel_start_rank + i}")
             for i in range(config.data_parallel_size_local)]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.is_alive() and p.pid is not None:
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.start()
    code = 0
    while any(p.is_alive() for p in procs):
        for p in procs:
            p.join(timeout=0.2)
            if not p.is_alive() and p.exitcode not in (0, None) and not stopping:
                code = exit_status(p.exitcode)
                how = (f"was killed by {signal.Signals(-p.exitcode).name}" if p.exitcode < 0
                       else f"exited with {p.exitcode}")
                log.error("%s %s; stopping the other ranks (exit code %d)", p.name, how, code)
                stop()
    return code or max(exit_status(p.exitcode or 0) for p in procs)


def exit_status(exitcode: int) -> int:
    """multiprocessing's exit code as a shell would give it: -N (killed by signal N) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
