"""Frontend CPU cost per streamed token: N concurrent SSE streams through the frontend, its CPU time read
from /proc before and after each round.

The headline is the paced case: sim engines stepping every --decode-ms (20 ms, a GPU's decode cadence:
one token per stream per step, so about one SSE event per token, which is what a real engine gives).
The second line is the instant case (steps take no time): the engine runs ahead, many tokens of a
stream share one event, and the figure flatters the per-token path. Each case has its own engine and
frontend processes; rounds alternate between them (and, with --top-logprobs K, between plain streams
and streams with K top_logprobs), so all see the same machine. Events per token are the content events
a stream received over its tokens. The frontend's idle CPU (ms per second, engines connected, no
requests) is measured before the rounds.
Usage: python bench/frontend_stream.py [--streams 256] [--tokens 200] [--ranks 1] [--repeat 3]
                                      [--decode-ms 20] [--top-logprobs 5] [--cases paced,instant]
                                      [--servers uvicorn,hypercorn] [--before REV] [--profile FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, int]:
    """Completion tokens of one stream, from its usage chunk (a token that ends inside a UTF-8
    character sends no text event of its own, so events are not tokens), and its content events."""
    tokens = events = 0
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b'data: {'):
                if b'"usage":{' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
                elif b'"content":' in line and b'"role":' not in line:
                    events += 1
    return tokens, events


async def _round(base: str, streams: int, tokens: int, top_logprobs: int | None = None) -> tuple[int, float]:
    n, _, wall = await _round_events(base, streams, tokens, top_logprobs)
    return n, wall


async def _round_events(base: str, streams: int, tokens: int,
                        top_logprobs: int | None = None) -> tuple[int, int, float]:
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}],
               "max_tokens": tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if top_logprobs is not None:
        request.update(logprobs=True, top_logprobs=top_logprobs)
    body = json.dumps(request).encode()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(session, base + "/v1/chat/completions", body) for _ in range(streams)))
        return sum(c[0] for c in counts), sum(c[1] for c in counts), time.perf_counter() - t0


def wait_ready(base: str, timeout_s: float = 120.0) -> None:
    """Until the frontend's /ready says 200 (its engines handshaken)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if urllib.request.urlopen(base + "/ready", timeout=1).status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base} not ready")
        time.sleep(0.2)


def tree_at(rev: str) -> Path:
    """A checkout of `rev` (a git worktree under /tmp, made once), whose frontend runs with this venv."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(f"/tmp/fleet-bench-{sha}")
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return tree


def _knows(tree: Path, flag: str) -> bool:
    """Whether the frontend in `tree` has this flag (an older revision may not: it runs its default)."""
    return flag in (tree / "services" / "frontend" / "config.py").read_text()


def start_case(paced: bool, server: str, args: argparse.Namespace, tree: Path = ROOT, interval: int = 1
               ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]:
    """A sim engine (paced or instant) and a frontend over it (the one in `tree`); the processes and the
    frontend's URL."""
    engine_port, http_port = _free_port(), _free_port()
    py = sys.executable
    timing = (["--sim-decode-ms", str(args.decode_ms), "--sim-decode-ms-per-seq", "0"] if paced
              else ["--sim-instant"])
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               *timing, "--host", "127.0.0.1", "--port", str(engine_port),
                               "--pub-port", str(_free_port()), "--data-parallel-size-local", str(args.ranks),
                               "--max-num-seqs", "1024"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    addresses = ",".join(f"tcp://127.0.0.1:{engine_port + i}" for i in range(args.ranks))
    # The main thread's CPU time, not wall time (a send that wakes the client would count the client's turn)
    # nor the process's (the socket thread's and ZMQ's I/O thread's would land on whatever main was running).
    profiled = paced and args.profile and server == args.servers.split(",")[0] and tree == ROOT
    profile = ["-c", "import cProfile, runpy, sys, time; sys.argv[0] = 'frontend'\n"
               "p = cProfile.Profile(time.thread_time)\n"
               "try: p.runcall(runpy.run_module, 'services.frontend', run_name='__main__')\n"
               f"finally: p.dump_stats({args.profile!r})"] if profiled else ["-m", "services.frontend"]
    frontend = subprocess.Popen([py, *profile, "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--data-parallel-size", str(args.ranks),
                                 "--data-parallel-size-local", "0", "--engine-addresses", addresses,
                                 "--log-level", "warning",
                                 *(["--http-server", server] if server and _knows(tree, "--http-server") else []),
                                 *(["--stream-interval", str(interval)] if interval > 1 else [])],
                                cwd=tree)
    return engine, frontend, f"http://127.0.0.1:{http_port}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--decode-ms", type=float, default=20.0, help="the paced case's engine step")
    p.add_argument("--cases", default="paced,instant", help="paced, instant or both (the first is the headline)")
    p.add_argument("--servers", default="uvicorn", help="the frontend's --http-server, or several, compared")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU measured per case")
    p.add_argument("--stream-interval", default="1", help="the frontends' --stream-interval, or several, compared")
    p.add_argument("--before", default=None, metavar="REV",
                   help="also run the frontend of this git revision (a worktree), side by side")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="run the paced case's frontend under cProfile, its stats written to FILE at exit")
    p.add_argument("--top-logprobs", type=int, default=None,
                   help="also measure streams with logprobs and this many top_logprobs, side by side")
    args = p.parse_args()
    pacings = [c.strip() for c in args.cases.split(",") if c.strip()]
    assert pacings and set(pacings) <= {"paced", "instant"}, "--cases: paced, instant or both"
    trees = {"": ROOT, **({args.before: tree_at(args.before)} if args.before else {})}
    intervals = [int(i) for i in args.stream_interval.split(",")]
    # A case: (pacing, "server[@rev][/interval]").
    cases = [(pacing, server + (f"@{rev}" if rev else "") + (f"/interval {i}" if i > 1 else ""))
             for pacing in pacings for server in args.servers.split(",") for rev in trees for i in intervals]

    def start(case: tuple[str, str]) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]:
        name, _, interval = case[1].partition("/interval ")
        server, _, rev = name.partition("@")
        return start_case(case[0] == "paced", server, args, trees[rev], int(interval or 1))

    procs = {case: start(case) for case in cases}
    try:
        for _, _, base in procs.values():
            wait_ready(base)
        kinds: list[int | None] = [None] if args.top_logprobs is None else [None, args.top_logprobs]
        for _, _, base in procs.values():
            for kind in kinds:
                asyncio.run(_round(base, 8, 20, kind))  # warm-up
        idle: dict[tuple[str, str], float] = {}
        time.sleep(1)
        for case, (_, frontend, _) in procs.items():
            cpu0 = _cpu_seconds(frontend.pid)
            time.sleep(args.idle_s)
            idle[case] = (_cpu_seconds(frontend.pid) - cpu0) / args.idle_s * 1e3
        keys = [(case, kind) for case in cases for kind in kinds]
        per_token: dict[Any, list[float]] = {k: [] for k in keys}
        rates: dict[Any, list[float]] = {k: [] for k in keys}
        events: dict[Any, list[float]] = {k: [] for k in keys}
        for _ in range(args.repeat):
            for case, kind in keys:  # interleaved, so every case sees the same machine
                frontend, base = procs[case][1], procs[case][2]
                cpu0 = _cpu_seconds(frontend.pid)
                n, e, wall = asyncio.run(_round_events(base, args.streams, args.tokens, kind))
                cpu = _cpu_seconds(frontend.pid) - cpu0
                assert n == args.streams * args.tokens, f"expected {args.streams * args.tokens} tokens, got {n}"
                per_token[(case, kind)].append(cpu / n * 1e6)
                rates[(case, kind)].append(n / wall)
                events[(case, kind)].append(e / n)
        print(f"{args.streams} concurrent streams x {args.tokens} tokens, {args.ranks} sim rank(s); "
              f"medians of {args.repeat} runs")
        for (pacing, server), kind in keys:
            what = f"paced {args.decode_ms:g} ms" if pacing == "paced" else "instant"
            what += f", {server}" + ("" if kind is None else f", top_logprobs={kind}")
            runs = per_token[((pacing, server), kind)]
            print(f"[{what}] frontend CPU per streamed token: {statistics.median(runs):6.1f} us "
                  f"(runs: {', '.join(f'{x:.1f}' for x in runs)}); "
                  f"events per token {statistics.median(events[((pacing, server), kind)]):.2f}; "
                  f"tokens/s {statistics.median(rates[((pacing, server), kind)]):,.0f}")
        for (pacing, server), ms in idle.items():
            print(f"[{pacing}, {server}] frontend idle CPU: {ms:.1f} ms per second")
    finally:
        for engine, frontend, _ in procs.values():
            for proc in (frontend, engine):
                proc.send_signal(signal.SIGTERM)
        for engine, frontend, _ in procs.values():
            for proc in (frontend, engine):
                proc.wait(60)


if __name__ == "__main__":
    main()
