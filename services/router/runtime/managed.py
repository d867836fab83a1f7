"""Managed workers of the model runtime (router process): per replica of a managed deployment, one
headless engine (`--runner pooling`) and one frontend pointed at it (`--data-parallel-size-local 0
--engine-addresses`, as deploy/local/up.py runs the fleet), on free loopback ports; each process
restarted with capped exponential back-off when it dies, and all stopped when the router stops.

Secrets go in the environment, never on a command line (`ps` shows it): a handshake token for the
engine (protocol.handshake.TOKEN_ENV) and an API key for the frontend (FLEET_API_KEY), both made
here per deployment, so other users of the host cannot drive the workers over loopback."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.handshake import TOKEN_ENV
from services.router.config import DeploymentConfig

log = logging.getLogger("router.runtime")

API_KEY_ENV = "FLEET_API_KEY"  # the frontend's --api-key, from the environment
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0  # a process that ran this long before it died starts its back-off from the first step
STOP_TIMEOUT_S = 15.0


_handed_out: set[int] = set()  # every port this router gave a worker: its workers hold them


def free_port() -> int:
    """A loopback port free now (the OS's pick), never one handed out before: the probe socket closes
    before the worker binds, so the OS may pick the same port again for the next call. A worker that
    loses the port to another program dies and is restarted on the same port (its URL is its pool's
    replica, fixed at start); the back-off and the log say so."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@dataclass(slots=True)
class Secrets:
    token: str  # the engine handshake token
    api_key: str  # the frontend's key, sent by the runtime as a bearer token

    @staticmethod
    def fresh() -> Secrets:
        return Secrets(secrets.token_hex(32), secrets.token_hex(32))


class Supervised:
    """One process, started again with back-off each time it exits until `stop`."""

    def __init__(self, label: str, cmd: Sequence[str], env: dict[str, str]) -> None:
        self.label = label
        self.cmd = list(cmd)
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def started(self) -> None:
        """Until the first process is running."""
        await self._started.wait()

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self._stopping:
            began = time.monotonic()
            # Each in a session of its own: stopping it signals its whole group (anything it started),
            # and a Ctrl-C at the router's terminal reaches the router alone, which stops it in order.
            guarded = [sys.executable, "-m", "services.router.runtime.orphan_guard", str(os.getpid()), *self.cmd]
            try:
                self.proc = await asyncio.create_subprocess_exec(*guarded, env=self.env, start_new_session=True)
            except OSError as exc:  # no process at all (out of memory, too many processes): try again later
                why = f"could not start ({exc})"
            else:
                self._started.set()
                code = await self.proc.wait()
                if self._stopping:
                    return
                why = f"(pid {self.proc.pid}) exited with {_exit_reason(code)}"
            if time.monotonic() - began >= STABLE_S:
                backoff = BACKOFF_FIRST_S
            self.restarts += 1
            log.warning("%s %s; restart %d in %gs", self.label, why, self.restarts, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after STOP_TIMEOUT_S; no restart after this."""
        self._stopping = True
        if self._task is not None:  # first, so that no new process starts while this one stops
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("%s (pid %d) did not stop in %.0fs; killing it", self.label, proc.pid, STOP_TIMEOUT_S)
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()


class ManagedReplica:
    """One worker of a managed deployment: an engine and the frontend that serves it."""

    def __init__(self, config: DeploymentConfig, index: int, keys: Secrets) -> None:
        managed = config.managed
        assert managed is not None  # only managed deployments have managed replicas
        self.engine_port, self.port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        label = f"deployment {config.name} replica {index}"
        base = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, API_KEY_ENV)}
        # The pooling head the tasks need (a causal model can serve either); score and rerank alone take
        # the model's own. The deployment's engine_args come last, so they can still name another.
        convert = "classify" if "classify" in config.tasks else "embed" if "embed" in config.tasks else "auto"
        engine = [sys.executable, "-m", "services.engine", "--headless", "--runner", "pooling", "--convert", convert,
                  "--model", config.model, "--backend", managed.backend, "--host", "127.0.0.1",
                  "--port", str(self.engine_port), "--data-parallel-size-local", "1", *managed.engine_args]
        frontend = [sys.executable, "-m", "services.frontend", "--model", config.model,
                    "--served-model-name", config.model, "--host", "127.0.0.1", "--port", str(self.port),
                    "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                    "--engine-addresses", f"tcp://127.0.0.1:{self.engine_port}", *managed.frontend_args]
        self.engine = Supervised(f"{label}: engine", engine, {**base, TOKEN_ENV: keys.token})
        self.frontend = Supervised(f"{label}: frontend {self.url}", frontend,
                                   {**base, TOKEN_ENV: keys.token, API_KEY_ENV: keys.api_key})

    def start(self) -> None:
        """Both processes on their way; the runtime's health checks say when the worker is ready."""
        self.engine.start()
        self.frontend.start()

    async def stop(self) -> None:
        # The frontend first: it takes no more calls while its engine finishes what it has.
        await self.frontend.stop()
        await self.engine.stop()

    def describe(self) -> dict[str, object]:
        return {"engine": f"tcp://127.0.0.1:{self.engine_port}",
                "restarts": {"engine": self.engine.restarts, "frontend": self.frontend.restarts}}


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
