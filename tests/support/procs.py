"""Start real engine processes for tests, with free loopback ports and logs kept for failures."""
from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai


def _ephemeral_start() -> int:
    """The first port the kernel hands out as a connection's own (Linux's ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Where free_port_block looks first: below the ephemeral range, so that no connection made meanwhile
# (by any process here) takes a port as its source port between the check and the child's bind.
_FIXED_FROM = 20000
_turn = random.randrange(1 << 16)  # this process's place in its stripe: picks go through it in turn


@functools.cache
def _stripe() -> tuple[int, int]:
    """The ports this process picks from: those between _FIXED_FROM and the ephemeral range, split between
    the suite's xdist workers (two workers never pick the same port before either binds it)."""
    low, high = _FIXED_FROM, _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        width = (high - low) // count
        low += int(worker[2:]) % count * width
        high = low + width
    return low, high


def free_port_block(n: int = 1, *, spread: int = 100) -> int:
    """A base port P such that P..P+n-1 and P+spread..P+spread+n-1 look free on 127.0.0.1: from this
    process's stripe below the ephemeral range, in turn from a random start (no port handed out twice
    before the stripe wraps), or one the kernel picks where the stripe has no room."""
    global _turn
    low, high = _stripe()
    span = high - low  # one modulus for every block's size, so a turn never maps onto a port handed out
    for _ in range(200):
        if span - spread - n > 1000:
            base = low + _turn % span
            _turn += n
            if base + spread + n > high:  # past the stripe's end: the next turn wraps to its start
                continue
        else:
            with closing(socket.socket()) as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
            if base + spread + n >= 65535:
                continue
        ports = [base + i for i in range(n)] + [base + spread + i for i in range(n)]
        if all(_is_free(p) for p in ports):
            return base
    raise RuntimeError("no free port block found")


def pid_listening_on(port: int) -> int:
    """The process listening on a loopback TCP port (Linux /proc): how a test finds one rank of a
    supervised unit, whose processes all look alike from outside."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                return pid
        except OSError:  # gone meanwhile, or not ours to read
            continue
    raise LookupError(f"no process listens on port {port}")


def process_tree() -> dict[int, list[int]]:
    """Each process's children, by parent pid (Linux /proc), as they are now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the name, which may hold spaces: state, ppid
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """The processes below `pid` in `tree` (default: process_tree() now), parents before their children."""
    children = process_tree() if tree is None else tree
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (/proc's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)


def _is_free(port: int) -> bool:
    with closing(socket.socket()) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Longer than the services' own drains on SIGTERM (30 s by default: the engine's --drain-timeout, the frontend's
# and the router's --shutdown-timeout), so that a test's stop never cuts one that is still in its time.
STOP_TIMEOUT_S = 45.0


@dataclass
class Proc:
    """A service process started by a test, its output in a log file kept for failures."""
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; the exit code."""
        self.terminate()
        return self.wait_stopped(timeout_s)

    def terminate(self) -> None:
        """SIGTERM, if it still runs (to stop several at once, then wait_stopped on each)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Its exit code, SIGKILLed after `timeout_s`. One that did not stop first has each process of its
        tree that catches SIGUSR1 (the services' faulthandler) write its threads' stacks to the log, then
        the tree is killed (no orphaned engine left running) and the log's end printed, for the test's
        report."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            tree = [self.proc.pid, *descendants(self.proc.pid)]
            dumped = [pid for pid in tree if _catches(pid, signal.SIGUSR1)]  # to others it is a kill
            for pid in dumped:  # one at a time: they share the log
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
                time.sleep(0.3)
            for pid in [self.proc.pid, *descendants(self.proc.pid)]:  # any started meanwhile too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()
            tail = "\n".join(self.log().splitlines()[-200:])
            print(f"{self.log_path.name}: did not stop within {timeout_s:g}s; killed with its descendants after "
                  f"{len(dumped)} of the {len(tree)} processes dumped their stacks. The log's end:\n{tail}")
        return self.proc.returncode


@dataclass
class EngineProc(Proc):
    # Per local rank, read from its ready line: by default each rank's PUB port is the OS's choice.
    pub_ports: list[int] = field(default_factory=list)

    def endpoint(self, rank_offset: int = 0) -> str:
        return f"tcp://127.0.0.1:{self.port + rank_offset}"

    @property
    def pub_port(self) -> int:
        return self.pub_ports[0]

    def pub_endpoint(self, rank_offset: int = 0) -> str:
        return f"tcp://127.0.0.1:{self.pub_ports[rank_offset]}"

    def wait_log(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited ({self.proc.returncode}) before logging {text!r}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not log {text!r} within {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)

    def wait_ready(self, ranks: int = 1, timeout_s: float = 120.0) -> None:
        """Until every rank logged that it serves; fails at once if the process exits."""
        deadline = time.monotonic() + timeout_s
        while len(lines := _READY.findall(self.log())) < ranks:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited ({self.proc.returncode}) before it was ready:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine not ready within {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)
        self.pub_ports = [int(pub) for _, pub in sorted(lines, key=lambda line: int(line[0]))]


_READY = re.compile(r"rank (\d+) ready in .* pub=tcp://\S+:(\d+) ")



def start_engine(tmp_path: Path, *args: str, ranks: int = 1, env: dict[str, str] | None = None,
                 wait: bool = True, port: int | None = None) -> EngineProc:
    port = port if port is not None else free_port_block(ranks, spread=0)
    log_path = tmp_path / f"engine-{port}.log"
    cmd = [sys.executable, "-m", "services.engine", "--headless", "--host", "127.0.0.1",
           "--port", str(port), "--data-parallel-size-local", str(ranks), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    engine = EngineProc(proc, port, log_path)
    if wait:
        try:
            engine.wait_ready(ranks)
        except BaseException:
            engine.stop()
            raise
    return engine


@dataclass
class HttpProc(Proc):
    """A process serving HTTP on a loopback port: a test backend, a router, a frontend."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_http(self, path: str = "/health", timeout_s: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log_path.stem} exited ({self.proc.returncode}):\n{self.log()}")
            try:
                httpx.get(self.url + path, timeout=2)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise TimeoutError(f"{self.url}{path} never answered:\n{self.log()}")

    def wait_ready(self, headers: dict[str, str] | None = None, timeout_s: float = 300.0) -> dict[str, Any]:
        """/ready's body once it answers 200 (503 meanwhile: a router's managed workers are starting);
        fails at once if the process exits."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = httpx.get(self.url + "/ready", headers=headers, timeout=5)
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 200:
                return dict(r.json())
            assert r is None or r.status_code == 503, r.text
            assert self.proc.poll() is None, f"exited ({self.proc.returncode}):\n{self.log()}"
            assert time.monotonic() < deadline, f"/ready not 200 within {timeout_s:g}s:\n{self.log()}"
            time.sleep(0.1)

    def configure(self, **settings: object) -> None:
        """Test backend only: change its behaviour (status, delay_s, reply, finish_reason, healthy, ...)."""
        import httpx

        httpx.post(self.url + "/admin/config", json=settings, timeout=5).raise_for_status()

    def reset(self) -> None:
        """Test backend only: default behaviour, stats from zero."""
        import httpx

        httpx.post(self.url + "/admin/reset", timeout=5).raise_for_status()

    def stats(self) -> dict:  # type: ignore[type-arg]
        import httpx

        return httpx.get(self.url + "/admin/stats", timeout=5).json()



@dataclass
class FrontendProc(HttpProc):
    def wait_ready(self, timeout_s: float = 120.0, *, status: int = 200,
                   all_ranks: bool = True) -> dict:  # type: ignore[type-arg]
        """Poll /ready until it answers `status` (fails at once if the process exits); a 200 with
        `all_ranks` only once no rank is missing (/ready is 200 as soon as one rank serves)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"frontend exited ({self.proc.returncode}):\n{self.log()}")
            try:
                r = httpx.get(self.url + "/ready", timeout=2)
                last = (r.status_code, r.text)
                if r.status_code == status and not (status == 200 and all_ranks and "missing" in r.json()):
                    return r.json()
            except httpx.TransportError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"/ready never answered {status} (last: {last}):\n{self.log()}")



def start_frontend(tmp_path: Path, *args: str, wait_status: int | None = 200, port: int | None = None) -> FrontendProc:
    port = port if port is not None else free_port_block(1, spread=0)
    log_path = tmp_path / f"frontend-{port}-{time.monotonic_ns()}.log"  # one per start: a restart keeps the port
    cmd = [sys.executable, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
           "--port", str(port), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    fe = FrontendProc(proc, port, log_path)
    if wait_status is not None:
        try:
            fe.wait_ready(status=wait_status)
        except BaseException:
            fe.stop()
            raise
    return fe


def _spawn(tmp_path: Path, stem: str, cmd: list[str], port: int) -> HttpProc:
    log_path = tmp_path / f"{stem}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return HttpProc(proc, port, log_path)


def start_backend(tmp_path: Path, name: str) -> HttpProc:
    """The OpenAI-compatible test backend (tests/support/openai_backend.py), answering "<name>:<model>"."""
    port = free_port_block(1, spread=0)
    backend = _spawn(tmp_path, f"backend-{name}", [sys.executable, "-m", "tests.support.openai_backend",
                                                     "--port", str(port), "--name", name], port)
    try:
        backend.wait_http()
    except BaseException:
        backend.stop()
        raise
    return backend


def start_router(tmp_path: Path, config: str, *args: str, port: int | None = None, wait: bool = True) -> HttpProc:
    """A router serving `config` (YAML text; `{port}` in it is replaced by the listener port), with
    extra command-line `args`."""
    port = port if port is not None else free_port_block(1, spread=0)
    path = tmp_path / f"router-{port}.yaml"
    path.write_text(config.replace("{port}", str(port)))
    router = _spawn(tmp_path, "router", [sys.executable, "-m", "services.router", "--config", str(path), *args],
                    port)
    if wait:
        try:
            router.wait_http()
        except BaseException:
            router.stop()
            raise
    return router


def group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    """Whether process group `pgid` is empty within `timeout_s`: a killed child lingers as a zombie
    until its new parent reaps it, and signal 0 still finds a zombie."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@contextmanager
def openai_over_sim(tmp_path: Path, engine_args: Sequence[str] = (), frontend_args: Sequence[str] = ()
                    ) -> Iterator[openai.OpenAI]:
    """An openai client of a frontend process over one headless sim rank (`--model tiny --backend sim`
    plus `engine_args`), both stopped on exit."""
    engine = start_engine(tmp_path, "--model", "tiny", "--backend", "sim", *engine_args)
    try:
        fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                            *frontend_args)
        try:
            with openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60) as client:
                yield client
        finally:
            fe.stop()
    finally:
        engine.stop()


def managed_worker_key(url: str) -> str:
    """A router's managed worker's API key: made by the router and given to the worker's frontend in its
    environment only, so a test reads it there (the same user's process) to ask the worker itself."""
    pid = pid_listening_on(int(url.rsplit(":", 1)[1]))
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    [key] = [item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"FLEET_API_KEY=")]
    return key
