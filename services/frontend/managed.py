"""Managed mode: the frontend starts its own headless engine ranks as child processes, supervises them
and stops them on exit."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import tracing
from protocol.handshake import TOKEN_ENV
from services.frontend.config import FrontendConfig

log = logging.getLogger(__name__)


class ManagedEngines:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.addresses = [f"tcp://127.0.0.1:{config.engine_port + i}"
                          for i in range(config.data_parallel_size_local)]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        c = self.config
        cmd = [sys.executable, "-m", "services.engine", "--headless", "--model", c.model, "--backend", c.backend,
               "--host", "127.0.0.1", "--port", str(c.engine_port),
               "--data-parallel-size-local", str(c.data_parallel_size_local),
               "--max-logprobs", str(c.max_logprobs), *c.engine_args]
        if c.otlp_traces_endpoint:
            cmd += [tracing.FLAG, c.otlp_traces_endpoint]
        # The token goes in the environment, not on the command line (which `ps` shows); the engines
        # bind loopback here, where they take one if given and need none otherwise.
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        if c.auth_token:
            env[TOKEN_ENV] = c.auth_token
        log.info("starting %d %s engine rank(s): %s", c.data_parallel_size_local, c.backend, " ".join(cmd))
        self._proc = subprocess.Popen(cmd, env=env)

    def exited(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def stop(self, timeout_s: float = 30.0) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("engines did not stop in %.0fs; killing them", timeout_s)
            proc.kill()
            proc.wait()
