"""Frontend CPU cost per streamed token: N concurrent SSE streams through the frontend against sim
engines in instant mode (the engine costs ~nothing, so the frontend's own work is what is measured).

Starts a sim engine (R ranks) and a frontend as separate processes, streams N chat completions at
once with an aiohttp client, and reads the frontend's CPU time from /proc before and after.
With --top-logprobs K every repeat runs a round without logprobs and one with logprobs and K
top_logprobs (the sim's fake distribution), against the same processes, and both are reported.
Usage: python bench/frontend_stream.py [--streams 256] [--tokens 200] [--ranks 1] [--repeat 3]
                                      [--top-logprobs 5]
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


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    """Completion tokens of one stream, from its usage chunk (a token that ends inside a UTF-8
    character sends no text event of its own, so events are not tokens)."""
    tokens = 0
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b'data: {') and b'"usage":{' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens


async def _round(base: str, streams: int, tokens: int, top_logprobs: int | None = None) -> tuple[int, float]:
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}],
               "max_tokens": tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if top_logprobs is not None:
        request.update(logprobs=True, top_logprobs=top_logprobs)
    body = json.dumps(request).encode()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(session, base + "/v1/chat/completions", body) for _ in range(streams)))
        return sum(counts), time.perf_counter() - t0


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--top-logprobs", type=int, default=None,
                   help="also measure streams with logprobs and this many top_logprobs, side by side")
    args = p.parse_args()
    engine_port, http_port = _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-instant", "--host", "127.0.0.1", "--port", str(engine_port),
                               "--pub-port", str(_free_port()), "--data-parallel-size-local", str(args.ranks),
                               "--max-num-seqs", "512"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    addresses = ",".join(f"tcp://127.0.0.1:{engine_port + i}" for i in range(args.ranks))
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--data-parallel-size", str(args.ranks),
                                 "--data-parallel-size-local", "0", "--engine-addresses", addresses,
                                 "--log-level", "warning"], cwd=ROOT)
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_ready(base)
        kinds: list[int | None] = [None] if args.top_logprobs is None else [None, args.top_logprobs]
        for kind in kinds:
            asyncio.run(_round(base, 8, 20, kind))  # warm-up
        per_token: dict[int | None, list[float]] = {k: [] for k in kinds}
        rates: dict[int | None, list[float]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for kind in kinds:  # interleaved, so both see the same machine
                cpu0 = _cpu_seconds(frontend.pid)
                n, wall = asyncio.run(_round(base, args.streams, args.tokens, kind))
                cpu = _cpu_seconds(frontend.pid) - cpu0
                assert n == args.streams * args.tokens, f"expected {args.streams * args.tokens} tokens, got {n}"
                per_token[kind].append(cpu / n * 1e6)
                rates[kind].append(n / wall)
        print(f"{args.streams} concurrent streams x {args.tokens} tokens, {args.ranks} sim rank(s), instant mode")
        for kind in kinds:
            what = "no logprobs" if kind is None else f"logprobs, top_logprobs={kind}"
            print(f"[{what}] frontend CPU per streamed token: median {statistics.median(per_token[kind]):.1f} us "
                  f"(runs: {', '.join(f'{x:.1f}' for x in per_token[kind])})")
            print(f"[{what}] output tokens/s through HTTP: median {statistics.median(rates[kind]):,.0f} "
                  f"(runs: {', '.join(f'{x:,.0f}' for x in rates[kind])})")
    finally:
        for proc in (frontend, engine):
            proc.send_signal(signal.SIGTERM)
        for proc in (frontend, engine):
            proc.wait(60)


if __name__ == "__main__":
    main()
