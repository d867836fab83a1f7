"""Router added latency and CPU, two shapes, each sent straight to a test backend and through a router in
front of it (one pool, one replica), in alternating rounds of the same run.

Non-streamed (the default): chat requests to a zero-delay backend at concurrency 1 and 64; p50/p99 each
way, their difference, requests/s, and the CPU the serving processes (backend + router) spent per request.

Streamed (`--stream`): 64 concurrent streamed chat completions of 16 and of 256 chunks, the backend
pacing each stream's chunks 20 ms apart (a GPU's decode step; issue 27 measured 16 tokens through a
frontend over a sim paced the same). Per shape: the router process's CPU per request (less its idle
CPU, measured during the direct rounds), the fit cost = a + b * chunks from the two shapes (a per
request, b per chunk; chunks counts [DONE]), and the added latency to the first byte of the body
(TTFT) and to its end, p50/p99 (each round's router figure less the same round's direct one, the
median over rounds). `--before REV` runs the router of git revision REV (a worktree under /tmp) beside
this checkout's, both in front of the same backend, in the same alternating rounds; `--profile FILE`
runs this checkout's router under cProfile (its stats written to FILE at exit; the figures then
include the profiler's cost). `--spread` starts stream i i/streams of one stream's paced length into the
round (streams that start together stay in step: each wave's requests all arrive in the same
millisecond and queue behind each other). `--pin` puts the routers on CPU 1 and the backend and the client
on CPU 0 (a router with a core of its own; unpinned, on this 2-core host, every CPU second a router spends
in a wave is taken from the backend's). `--floor` adds a TCP byte pipe (no HTTP parsed, each client connection
paired with an upstream one) as a target: what any relay on one asyncio loop pays at least; `--c-floor` the
same pipe in C (bench/relay_floor.c): what any relay in user space pays, the kernel's part. `--http-floor`
adds the least HTTP router (bench/router_floor.py: the request parsed, its model replaced, the response's
bytes passed through and parsed for its end; nothing else): what any router in Python that reads HTTP pays.
`--decide-floor` adds the same doing the router's own parts with the router's code (router_floor.py --decide):
what the router's request path costs without the glue between its parts.

The backend, the routers and this client are separate processes. The client is a minimal HTTP/1.1
keep-alive client on raw asyncio (uvloop if installed), so its own CPU per request, paid equally on
every path, stays small next to the servers' on a shared machine.
Usage: .venv/bin/python bench/router_latency.py [--requests 6000] [--rounds 6] [--concurrency 1,64]
       .venv/bin/python bench/router_latency.py --stream [--rounds 3] [--chunks 16,256] [--streams 64]
                                                [--chunk-ms 20] [--round-chunks 16384] [--before REV]
                                                [--floor] [--c-floor] [--http-floor] [--decide-floor]
                                                [--spread] [--pin] [--profile FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import HttpProc, free_port_block, start_backend, start_router  # noqa: E402

TARGET_P50_MS, TARGET_P99_MS = 1.0, 5.0
TICKS = os.sysconf("SC_CLK_TCK")
_IDLE_OK_S = 4.0  # under the test backend's keep-alive (uvicorn's 5 s)
BODY = (b'{"model":"fleet","messages":[{"role":"user","content":"Hello there, how are you?"}],'
        b'"max_tokens":8}')


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs BODY and reads a Content-Length or chunked reply."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n").encode() + BODY
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.close()
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self) -> tuple[int, bool]:
        """Send the request, read the whole response; its status, and whether the server will close
        the connection (hypercorn does after 1,000 requests on one connection)."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked, closing = None, False, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                closing = b"close" in value
        if length is not None:
            await self.reader.readexactly(length)
        elif chunked:
            while (size := int((await self.reader.readline()).split(b";")[0], 16)) > 0:
                await self.reader.readexactly(size + 2)
            await self.reader.readline()  # the blank line after the last chunk (no trailers sent)
        else:
            raise RuntimeError(f"response without a length:\n{head.decode(errors='replace')}")
        return status, closing

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def run_round(port: int, concurrency: int, requests: int) -> tuple[list[float], float, dict[int, int]]:
    """`requests` POSTs over `concurrency` fresh keep-alive connections (opened before the clock
    starts: the backend closes connections idle for 5 s, longer than a round of the other target).
    Latencies in ms, the round's wall time in s, and the count of each non-200 status."""
    conns = [await Connection(port).open() for _ in range(concurrency)]
    latencies: list[float] = []
    errors: dict[int, int] = {}
    left = requests

    async def worker(conn: Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            status, closing = await conn.post()
            latencies.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                errors[status] = errors.get(status, 0) + 1
            if closing:
                await conn.open()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return latencies, wall, errors


def cpu_seconds(pid: int) -> float:
    """The process's CPU time (all its threads, user and kernel) to the nanosecond: its CPU clock
    (clock_getcpuclockid's id for a process), where /proc's utime + stime count 10 ms ticks."""
    return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED of the whole process


def sys_seconds(pid: int) -> float:
    """The kernel's share (stime): on loopback, a send also runs the receiver's TCP stack."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / TICKS


async def measure(ports: dict[str, int], pids: list[int], concurrency: int, requests: int, rounds: int) -> None:
    per_round = max(concurrency, requests // rounds)
    for port in ports.values():  # warm-up: connections, the router's upstream pool, code paths
        await run_round(port, concurrency, max(200, concurrency * 4))
    samples: dict[str, list[float]] = {name: [] for name in ports}
    walls = {name: 0.0 for name in ports}
    cpu = {name: 0.0 for name in ports}  # CPU seconds of backend + router during the target's rounds
    errors: dict[str, dict[int, int]] = {name: {} for name in ports}
    added_p50: list[float] = []
    for i in range(rounds):
        # Alternate which target goes first, so drift in machine load does not favour one of them.
        order = list(ports) if i % 2 == 0 else list(reversed(ports))
        p50 = {}
        for name in order:
            cpu0 = sum(map(cpu_seconds, pids))
            latencies, wall, errs = await run_round(ports[name], concurrency, per_round)
            cpu[name] += sum(map(cpu_seconds, pids)) - cpu0
            samples[name] += latencies
            walls[name] += wall
            p50[name] = statistics.median(latencies)
            for status, n in errs.items():
                errors[name][status] = errors[name].get(status, 0) + n
        added_p50.append(p50["router"] - p50["direct"])
    stats = {}
    for name, values in samples.items():
        values.sort()
        stats[name] = (percentile(values, 0.50), percentile(values, 0.99), len(values) / walls[name],
                       cpu[name] / len(values) * 1e6)
    (d50, d99, drps, dcpu), (r50, r99, rrps, rcpu) = stats["direct"], stats["router"]
    print(f"{concurrency:>4} {d50:8.3f} {d99:8.3f} {r50:8.3f} {r99:8.3f} {r50 - d50:8.3f} {r99 - d99:8.3f} "
          f"{drps:8.0f} {rrps:8.0f} {dcpu:7.0f} {rcpu:7.0f}   {min(added_p50):.3f}..{max(added_p50):.3f}")
    for name, errs in errors.items():
        if errs:
            print(f"     {name}: non-200 answers {dict(sorted(errs.items()))} of {len(samples[name])}")


class StreamConnection(Connection):
    """A keep-alive connection that POSTs a streamed chat request and times the first body chunk and the end."""

    def __init__(self, port: int, body: bytes) -> None:
        super().__init__(port)
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body

    async def stream(self) -> tuple[int, float, float, bool]:
        """Status, seconds to the first body byte and to the end (from the request's send), and whether
        the server will close the connection."""
        assert self.reader is not None and self.writer is not None
        t0 = time.perf_counter()
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lowered = head.lower()
        closing = b"connection: close" in lowered
        first = math.nan
        if b"transfer-encoding: chunked" in lowered:
            while (size := int((await self.reader.readline()).split(b";")[0], 16)) > 0:
                await self.reader.readexactly(size + 2)
                if first != first:  # NaN: the first piece of the body
                    first = time.perf_counter() - t0
            await self.reader.readline()
        else:
            length = next(int(line.split(b":")[1]) for line in lowered.split(b"\r\n")
                          if line.startswith(b"content-length:"))
            await self.reader.readexactly(length)
            first = time.perf_counter() - t0
        return status, first, time.perf_counter() - t0, closing


@dataclass
class StreamRound:
    """One target's round: TTFT and end latencies (ms), wall time, the routers' CPU seconds (all, and
    the kernel's), errors."""
    ttft: list[float]
    end: list[float]
    wall: float
    cpu: dict[str, float]
    sys: dict[str, float]
    errors: dict[int, int]


async def stream_round(port: int, body: bytes, streams: int, per_stream: int, pids: dict[str, int],
                       spread_s: float = 0.0) -> StreamRound:
    """`streams` connections (opened before the clock starts), each sending `per_stream` streamed
    requests one after another. `spread_s`: stream i sends its first request i / streams of it after
    the start (else all at once)."""
    conns = [StreamConnection(port, body) for _ in range(streams)]
    for conn in conns:
        await conn.open()
    ttft: list[float] = []
    end: list[float] = []
    errors: dict[int, int] = {}

    async def worker(conn: StreamConnection, offset: float) -> None:
        if offset:
            await asyncio.sleep(offset)
            if offset > _IDLE_OK_S:  # the backend closes a connection idle for 5 s
                await conn.open()
        for _ in range(per_stream):
            status, first, last, closing = await conn.stream()
            ttft.append(first * 1000)
            end.append(last * 1000)
            if status != 200:
                errors[status] = errors.get(status, 0) + 1
            if closing:
                await conn.open()

    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    sys0 = {name: sys_seconds(pid) for name, pid in pids.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c, i * spread_s / streams) for i, c in enumerate(conns)))
    wall = time.perf_counter() - t0
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    kernel = {name: sys_seconds(pid) - sys0[name] for name, pid in pids.items()}
    for c in conns:
        c.close()
    return StreamRound(ttft, end, wall, cpu, kernel, errors)


@dataclass
class ShapeResult:
    """A target's figures at one stream length, each the median over rounds."""
    cpu_us: float  # router CPU per request, its idle CPU subtracted
    sys_us: float  # of which the kernel's (not idle-subtracted)
    ttft_p50: float  # added to direct's, ms
    ttft_p99: float
    end_p50: float
    end_p99: float
    rps: float
    errors: dict[int, int]


async def measure_stream(ports: dict[str, int], pids: dict[str, int], body: bytes, streams: int,
                         per_stream: int, rounds: int, spread_s: float = 0.0) -> dict[str, ShapeResult]:
    """Rounds over every target (direct and each router), the order rotating each round. A router's idle
    CPU rate is what it spent during the direct rounds (health checks, timers), per second."""
    for port in ports.values():  # warm-up: connections, the routers' upstream pools, code paths
        await stream_round(port, body, streams, 1, {})
    runs: dict[str, list[StreamRound]] = {name: [] for name in ports}
    names = list(ports)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            # Non-streamed requests first, unmeasured: a router's upstream connections, idle past their
            # keep-alive during the other targets' rounds, are open again when the round starts.
            await run_round(ports[name], streams, streams)
            runs[name].append(await stream_round(ports[name], body, streams, per_stream, pids, spread_s))
    idle = {router: statistics.median(r.cpu[router] / r.wall for r in runs["direct"]) for router in pids}
    out = {}
    for name in names:
        cpu, kernel, t50, t99, e50, e99, rps = [], [], [], [], [], [], []
        errors: dict[int, int] = {}
        for direct, r in zip(runs["direct"], runs[name], strict=True):
            n = len(r.end)
            if name in pids:
                cpu.append((r.cpu[name] - idle[name] * r.wall) / n * 1e6)
                kernel.append(r.sys[name] / n * 1e6)
            t50.append(percentile(r.ttft, 0.50) - percentile(direct.ttft, 0.50))
            t99.append(percentile(r.ttft, 0.99) - percentile(direct.ttft, 0.99))
            e50.append(percentile(r.end, 0.50) - percentile(direct.end, 0.50))
            e99.append(percentile(r.end, 0.99) - percentile(direct.end, 0.99))
            rps.append(n / r.wall)
            for status, k in r.errors.items():
                errors[status] = errors.get(status, 0) + k
        out[name] = ShapeResult(statistics.median(cpu) if cpu else math.nan,
                                statistics.median(kernel) if kernel else math.nan, statistics.median(t50),
                                statistics.median(t99), statistics.median(e50), statistics.median(e99),
                                statistics.median(rps), errors)
    return out


def configure_backend(url: str, settings: dict[str, Any]) -> None:
    request = urllib.request.Request(url + "/admin/config", data=json.dumps(settings).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def start_router_in(tree: Path, tmp: Path, config: str, profile: str | None = None) -> HttpProc:
    """A router running `tree`'s code with this venv (under cProfile when `profile` names a stats file)."""
    port = free_port_block(1, spread=0)
    path = tmp / f"router-{port}.yaml"
    path.write_text(config.replace("{port}", str(port)))
    prof = ["-m", "cProfile", "-o", profile] if profile else []
    log_path = tmp / f"router-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, *prof, "-m", "services.router", "--config", str(path)],
                                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=log,
                                stderr=subprocess.STDOUT)
    router = HttpProc(proc, port, log_path)
    try:
        router.wait_http()
    except BaseException:
        router.stop()
        raise
    return router


class _Pipe(asyncio.Protocol):
    """One side of a byte pipe: what arrives is written to the other side as it is."""

    def __init__(self) -> None:
        self.peer: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what the client sent before the upstream connection was open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is none of asyncio's classes

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    # Backpressure: the peer's buffer full, stop reading this side until it drains.
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()


async def serve_pipe(port: int, upstream_port: int) -> None:
    """The floor of any relay on one event loop: a TCP byte pipe (no HTTP parsed), each client connection
    paired with its own upstream connection. What it costs per request and per chunk, a router cannot
    go under with this loop and these sockets."""
    loop = asyncio.get_running_loop()

    class Client(_Pipe):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            loop.create_task(self.open())

        async def open(self) -> None:
            up, side = await loop.create_connection(_Pipe, "127.0.0.1", upstream_port)
            assert self.transport is not None
            side.peer, self.peer = self.transport, up
            for data in self.early:
                up.write(data)

    server = await loop.create_server(Client, "127.0.0.1", port, backlog=2048)
    await server.serve_forever()


def start_floor(tmp: Path, name: str, upstream_port: int, config: str = "") -> HttpProc:
    """A floor in its own process, in front of the backend on `upstream_port`: the byte pipe (`pipe`, this
    file), the same pipe in C (`cpipe`, bench/relay_floor.c, built here with cc -O2), the least HTTP
    router (`least`, bench/router_floor.py) or the same with the router's own parts (`decide`: `config`, the
    router's config, as start_router_in takes it)."""
    port = free_port_block(1, spread=0)
    log_path = tmp / f"{name}-{port}.log"
    here = Path(__file__).parent
    if name == "cpipe":
        binary = tmp / "relay_floor"
        subprocess.run(["cc", "-O2", "-o", str(binary), str(here / "relay_floor.c")], check=True)
        command = [str(binary), str(port), str(upstream_port)]
    elif name == "pipe":
        command = [sys.executable, __file__, "--pipe", str(port), str(upstream_port)]
    else:
        command = [sys.executable, str(here / "router_floor.py"), str(port), str(upstream_port)]
        if name == "decide":
            path = tmp / f"decide-{port}.yaml"
            path.write_text(config.replace("{port}", str(port)))
            command += ["--decide", str(path)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    floor = HttpProc(proc, port, log_path)
    try:
        floor.wait_http()
    except BaseException:
        floor.stop()
        raise
    return floor


def stream_main(args: argparse.Namespace) -> None:
    from frontend_stream import tree_at

    lengths = [int(c) for c in args.chunks.split(",")]
    trees = {"router": ROOT, **({"before": tree_at(args.before)} if args.before else {})}
    with tempfile.TemporaryDirectory(prefix="bench-router-stream-") as tmp:
        backend = start_backend(Path(tmp), "a")
        routers: dict[str, HttpProc] = {}
        try:
            config = f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, replicas: [{{url: "{backend.url}"}}], max_inflight: {2 * args.streams}}}
entries:
  fleet: {{default: [p]}}
"""
            for name, tree in trees.items():
                routers[name] = start_router_in(tree, Path(tmp), config, args.profile if name == "router" else None)
            if args.floor:
                routers["pipe"] = start_floor(Path(tmp), "pipe", backend.port)
            if args.c_floor:
                routers["cpipe"] = start_floor(Path(tmp), "cpipe", backend.port)
            if args.http_floor:
                routers["least"] = start_floor(Path(tmp), "least", backend.port)
            if args.decide_floor:
                routers["decide"] = start_floor(Path(tmp), "decide", backend.port, config)
            label = {"direct": "direct", "router": "this checkout", "before": f"before ({args.before})",
                     "pipe": "byte pipe (floor)", "cpipe": "byte pipe in C", "least": "least HTTP router",
                     "decide": "least + router's parts"}
            print(f"router streamed: {args.streams} concurrent streamed chat completions, chunks paced "
                  f"{args.chunk_ms:g} ms by the test backend, one replica; {args.rounds} rounds rotating "
                  f"{', '.join(label[n] for n in ['direct', *routers])}; medians over rounds")
            print("arrivals: " + ("spread, stream i starting i / streams of one stream's length after the round's "
                                  "start (as independent clients arrive)" if args.spread else
                                  "together, every stream starting at once and staying in step (bursts)"))
            print("router CPU per request is the router process's, less its idle CPU; added latency is the "
                  "router's percentile less direct's in the same round (ms)")
            print(f"chunks  {'target':<22}  CPU us/req (sys)  TTFT+ p50  TTFT+ p99   end+ p50   end+ p99   req/s")
            ports = {"direct": backend.port, **{name: r.port for name, r in routers.items()}}
            pids = {name: r.proc.pid for name, r in routers.items()}
            if args.pin:
                # The routers on a CPU of their own, the backend and this client on the other: a router
                # deployed with its own core (a pod's CPU), which takes none from the backend.
                os.sched_setaffinity(0, {0})
                os.sched_setaffinity(backend.proc.pid, {0})
                for pid in pids.values():
                    os.sched_setaffinity(pid, {1})
                print("pinned: the routers on CPU 1, the backend and the client on CPU 0")
            results: dict[int, dict[str, ShapeResult]] = {}
            for n in lengths:
                configure_backend(backend.url, {"chunks": n, "chunk_delay_s": args.chunk_ms / 1000,
                                                "reply": "x" * n})
                body = (b'{"model":"fleet","messages":[{"role":"user","content":"Hello there, how are you?"}],'
                        b'"max_tokens":%d,"stream":true}' % n)
                per_stream = max(1, args.round_chunks // (n * args.streams))
                spread = n * args.chunk_ms / 1000 if args.spread else 0.0  # one stream's paced length
                shape = results[n] = run_loop_value(measure_stream(ports, pids, body, args.streams, per_stream,
                                                                   args.rounds, spread))
                for name, r in shape.items():
                    cpu = "" if name == "direct" else f"{r.cpu_us:10.0f} ({r.sys_us:4.0f})"
                    lat = ("" if name == "direct" else
                           f" {r.ttft_p50:10.3f} {r.ttft_p99:10.3f} {r.end_p50:10.3f} {r.end_p99:10.3f}")
                    print(f"{n + 1:>6}  {label[name]:<22}  {cpu:>16}{lat:>44} {r.rps:7.1f}")
                    if r.errors:
                        print(f"        {name}: non-200 answers {dict(sorted(r.errors.items()))}")
            if len(lengths) >= 2:
                lo, hi = lengths[0], lengths[-1]
                print(f"fit from {lo + 1} and {hi + 1} chunks (each counts [DONE]): cost = a + b * chunks")
                fits = {}
                for name in routers:
                    b = (results[hi][name].cpu_us - results[lo][name].cpu_us) / (hi - lo)
                    fits[name] = (results[lo][name].cpu_us - b * (lo + 1), b)
                    print(f"  {label[name]:<22} a = {fits[name][0]:7.0f} us per request   "
                          f"b = {fits[name][1]:6.2f} us per chunk")
                if "before" in fits:
                    (a0, b0), (a1, b1) = fits["before"], fits["router"]
                    print(f"  this checkout / before: a x{a1 / a0:.2f}, b x{b1 / b0:.2f}; CPU per request "
                          + ", ".join(f"{n + 1} chunks x{results[n]['router'].cpu_us / results[n]['before'].cpu_us:.2f}"
                                      for n in lengths))
            for name, router in routers.items():
                warnings = [line for line in router.log().splitlines() if " WARNING " in line or " ERROR " in line]
                if warnings:
                    print(f"{label[name]} logged {len(warnings)} warning/error line(s), first: {warnings[0]}")
        finally:
            for router in routers.values():
                router.stop()
            backend.stop()
    if args.profile:
        print(f"cProfile stats of this checkout's router: {args.profile} "
              f"(python -c \"import pstats; pstats.Stats('{args.profile}').sort_stats('tottime').print_stats(40)\")")


T = TypeVar("T")


def run_loop_value(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # optional, as for the router: plain asyncio costs the client a little more CPU
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000, help="per target and concurrency, over all rounds")
    ap.add_argument("--rounds", type=int, default=None, help="alternating direct/router rounds (default 6; --stream 3)")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--max-inflight", type=int, default=None,
                    help="the pool's cap (default: twice the highest concurrency; at the router's default "
                         "of 32 one replica answers 429 above 32 at once)")
    ap.add_argument("--stream", action="store_true", help="the streamed shape (module docstring)")
    ap.add_argument("--chunks", default="16,256", help="--stream: content chunks per stream, one run each")
    ap.add_argument("--streams", type=int, default=64, help="--stream: concurrent streams")
    ap.add_argument("--chunk-ms", type=float, default=20.0, help="--stream: the backend's pace between chunks")
    ap.add_argument("--round-chunks", type=int, default=16384,
                    help="--stream: chunks a target is sent per round, over all its streams (at least one "
                         "request each): rounds of either length take about as long")
    ap.add_argument("--before", metavar="REV", help="--stream: also the router of this git revision, side by side")
    ap.add_argument("--profile", metavar="FILE", help="--stream: this checkout's router under cProfile, stats to FILE")
    ap.add_argument("--spread", action="store_true",
                    help="--stream: stagger the streams' first requests over one stream's paced length (else "
                         "all start together and stay in step, every request of a wave arriving at once)")
    ap.add_argument("--floor", action="store_true",
                    help="--stream: also a TCP byte pipe in front of the backend (no HTTP parsed): the floor")
    ap.add_argument("--c-floor", action="store_true",
                    help="--stream: also the byte pipe in C (bench/relay_floor.c, built with cc): the floor of "
                         "any relay in user space, the kernel's share of a chunk with no interpreter on top")
    ap.add_argument("--http-floor", action="store_true",
                    help="--stream: also the least HTTP router in front of the backend (bench/router_floor.py): "
                         "a request parsed, its model replaced, the response passed through; nothing else")
    ap.add_argument("--decide-floor", action="store_true",
                    help="--stream: also the least HTTP router doing the router's own parts (router_floor.py "
                         "--decide: access, the body's parse, the decision, the lease, the payload, the counts), "
                         "none of the glue between them: what the router's request path costs at least")
    ap.add_argument("--pin", action="store_true",
                    help="--stream: the routers on CPU 1, the backend and this client on CPU 0 (a router with a "
                         "core of its own, as deployed; else all share every core)")
    ap.add_argument("--pipe", nargs=2, type=int, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pipe:
        run_loop(serve_pipe(*args.pipe))
        return
    if args.stream:
        args.rounds = args.rounds or 3
        stream_main(args)
        return
    args.rounds = args.rounds or 6
    levels = [int(c) for c in args.concurrency.split(",")]
    max_inflight = args.max_inflight or 2 * max(levels)
    with tempfile.TemporaryDirectory(prefix="bench-router-latency-") as tmp:
        backend = start_backend(Path(tmp), "a")
        router = None
        try:
            router = start_router(Path(tmp), f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, replicas: [{{url: "{backend.url}"}}], max_inflight: {max_inflight}}}
entries:
  fleet: {{default: [p]}}
""")
            print(f"router added latency: non-streaming chat, {args.requests} requests per target and "
                  f"concurrency in {args.rounds} alternating rounds; zero-delay test backend, one replica "
                  f"(max_inflight {max_inflight})")
            print(f"targets: added p50 < {TARGET_P50_MS:g} ms, added p99 < {TARGET_P99_MS:g} ms")
            print("conc   direct ms        router ms         added ms          req/s          "
                  "server CPU us/req  added p50")
            print("         p50      p99      p50      p99      p50      p99   direct   router  direct  router  "
                  "per round")
            ports = {"direct": backend.port, "router": router.port}
            pids = [backend.proc.pid, router.proc.pid]
            for c in levels:
                run_loop(measure(ports, pids, c, args.requests, args.rounds))
            warnings = [line for line in router.log().splitlines() if " WARNING " in line or " ERROR " in line]
            if warnings:
                print(f"router logged {len(warnings)} warning/error line(s), first: {warnings[0]}")
        finally:
            if router is not None:
                router.stop()
            backend.stop()


if __name__ == "__main__":
    main()
