"""Output tokens/s through the frontend with --api-server-count 1 and 2, side by side in one run.

Starts an instant sim engine (R ranks) and two frontends on it, one with one API server process and
one with two, and streams N chat completions at once through each in alternating rounds (each
stream on its own connection, so the kernel spreads them across the processes of a frontend).
On a host with few cores the engine, the client and the servers share them: the ratio says what
a second process buys there, not on a serving node.
Usage: python bench/api_servers.py [--streams 256] [--tokens 200] [--ranks 2] [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from frontend_stream import _free_port, _round, wait_ready

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    py = sys.executable
    engine_port = _free_port()
    while any(_port_taken(engine_port + i) for i in range(args.ranks)):
        engine_port = _free_port()
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-instant", "--host", "127.0.0.1", "--port", str(engine_port),
                               "--data-parallel-size-local", str(args.ranks), "--max-num-seqs", "1024"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addresses = ",".join(f"tcp://127.0.0.1:{engine_port + i}" for i in range(args.ranks))
    frontends: dict[int, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for count in (1, 2):
            port = _free_port()
            proc = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                     "--port", str(port), "--data-parallel-size", str(args.ranks),
                                     "--data-parallel-size-local", "0", "--engine-addresses", addresses,
                                     "--api-server-count", str(count), "--log-level", "warning"],
                                    cwd=ROOT, env={**os.environ})
            frontends[count] = proc, f"http://127.0.0.1:{port}"
        for _, base in frontends.values():
            wait_ready(base)
        time.sleep(3)  # the second API server's own engine links
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _, base in frontends.values():
            asyncio.run(_round(base, 16, 20))  # warm-up
        for _ in range(args.repeat):
            for count, (_, base) in frontends.items():
                n, wall = asyncio.run(_round(base, args.streams, args.tokens))
                assert n == args.streams * args.tokens, f"expected {args.streams * args.tokens} tokens, got {n}"
                rates[count].append(n / wall)
        print(f"{args.streams} concurrent streams x {args.tokens} tokens, {args.ranks} instant sim rank(s), "
              f"{os.cpu_count()} cores; output tokens/s through HTTP:")
        one = statistics.median(rates[1])
        for count, runs in rates.items():
            median = statistics.median(runs)
            print(f"  --api-server-count {count}: median {median:9,.0f}  x{median / one:.2f}  "
                  f"(runs: {', '.join(f'{x:,.0f}' for x in runs)})")
    finally:
        procs = [proc for proc, _ in frontends.values()] + [engine]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def _port_taken(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


if __name__ == "__main__":
    main()
