"""Router added latency: non-streaming chat requests sent straight to a zero-delay test backend and
through a router in front of it (one pool, one replica), in alternating rounds of the same run, at
concurrency 1 and 64; p50/p99 each way, their difference, requests/s, and the CPU the serving
processes (backend + router) spent per request.

The backend, the router and this client are three processes. The client is a minimal HTTP/1.1
keep-alive client on raw asyncio (uvloop if installed), so its own CPU per request, paid equally on
both paths, stays small next to the servers' on a shared machine.
Usage: .venv/bin/python bench/router_latency.py [--requests 6000] [--rounds 6] [--concurrency 1,64]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import start_backend, start_router  # noqa: E402

TARGET_P50_MS, TARGET_P99_MS = 1.0, 5.0
TICKS = os.sysconf("SC_CLK_TCK")
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
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


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
    ap.add_argument("--rounds", type=int, default=6, help="alternating direct/router rounds")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--max-inflight", type=int, default=None,
                    help="the pool's cap (default: twice the highest concurrency; at the router's default "
                         "of 32 one replica answers 429 above 32 at once)")
    args = ap.parse_args()
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
