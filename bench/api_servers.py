"""Output tokens/s through the frontend with --api-server-count 1 and 2, side by side in one run, and
where the machine's CPU went.

Starts an instant sim engine (R ranks) and two frontends on it, one with one API server process and
one with two, and streams N chat completions at once through each in alternating rounds (each
stream on its own connection, so the kernel spreads them across the processes of a frontend).
Each round reads the CPU time of every process from /proc: the engine's, each API server's (and any
child of theirs), and the client's own. On a host with fewer free cores than API servers + engine +
client, they share them, and the measured ratio says what a second process buys there. The last
column is what the same CPU times give when each API server has a core of its own and the engine and
client are not the bound: the round's tokens over the busiest API server's CPU seconds, a ceiling
measured per process, not a throughput measured.
Usage: python bench/api_servers.py [--streams 256] [--tokens 200] [--ranks 2] [--repeat 3] [--verbose]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from frontend_stream import _cpu_seconds, _free_port, _round, wait_ready

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import descendants, process_tree  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--verbose", action="store_true", help="print each round")
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
                                     "--api-server-count", str(count), "--log-level", "error"],
                                    cwd=ROOT, env={**os.environ})
            frontends[count] = proc, f"http://127.0.0.1:{port}"
        for _, base in frontends.values():
            wait_ready(base)
        time.sleep(3)  # the second API server's own engine links
        servers = {count: _servers(proc.pid) for count, (proc, _) in frontends.items()}
        assert len(servers[2]) == 2, f"expected two API server processes, found {servers[2]}"
        rounds: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        for _, base in frontends.values():
            asyncio.run(_round(base, 16, 20))  # warm-up
        for _ in range(args.repeat):
            for count, (_, base) in frontends.items():
                before = _cpu(engine.pid, servers[count])
                n, wall = asyncio.run(_round(base, args.streams, args.tokens))
                after = _cpu(engine.pid, servers[count])
                assert n == args.streams * args.tokens, f"expected {args.streams * args.tokens} tokens, got {n}"
                used = {k: after[k] - before[k] for k in after}
                busiest = max(v for k, v in used.items() if k.startswith("server"))
                if args.verbose:  # CPU seconds of each party in this round
                    print(count, {k: round(v, 3) for k, v in used.items()}, f"{n / wall:,.0f}", flush=True)
                rounds[count].append({"rate": n / wall, "wall": wall, "ceiling": n / busiest,
                                      **{k: v / wall for k, v in used.items()}})
        cores = os.cpu_count()
        print(f"{args.streams} concurrent streams x {args.tokens} tokens, {args.ranks} instant sim rank(s), "
              f"{cores} cores; output tokens/s through HTTP, and cores busy during the rounds (medians of "
              f"{args.repeat}):")
        one = statistics.median(r["rate"] for r in rounds[1])
        one_ceiling = statistics.median(r["ceiling"] for r in rounds[1])
        print(f"  {'':22} {'tokens/s':>9} {'ratio':>6}   {'each API server':>16} {'engine':>6} {'client':>6} "
              f"{'all':>5}   {'ceiling':>9} {'ratio':>6}")
        for count, runs in rounds.items():
            rate = statistics.median(r["rate"] for r in runs)
            ceiling = statistics.median(r["ceiling"] for r in runs)
            each = " ".join(f"{statistics.median(r[f'server{i}'] for r in runs):.2f}" for i in range(count))
            engine_cores = statistics.median(r["engine"] for r in runs)
            client_cores = statistics.median(r["client"] for r in runs)
            total = statistics.median(sum(v for k, v in r.items() if k not in ("rate", "wall", "ceiling"))
                                      for r in runs)
            print(f"  --api-server-count {count}: {rate:9,.0f} x{rate / one:.2f}   {each:>16} {engine_cores:6.2f} "
                  f"{client_cores:6.2f} {total:5.2f}   {ceiling:9,.0f} x{ceiling / one_ceiling:.2f}")
        print("  (ceiling: tokens over the busiest API server's CPU seconds, each server on a core of its own)")
    finally:
        procs = [proc for proc, _ in frontends.values()] + [engine]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def _descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    """`pid` and the processes below it."""
    return [pid, *descendants(pid, tree)]


def _servers(pid: int) -> list[list[int]]:
    """The API server processes of the frontend whose main process is `pid` (API server 0), each with the
    processes under it. A sibling is a child of API server 0 named api-server-i (multiprocessing's spawn
    sets no name the kernel sees, so its command line tells it: spawn_main). Other children of API server
    0 (the resource tracker, translation workers) are counted as its own."""
    tree = process_tree()
    siblings = [c for c in tree.get(pid, []) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()
                and b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    own = [pid] + [d for c in tree.get(pid, []) if c not in siblings for d in _descendants(c, tree)]
    return [own] + [_descendants(s, tree) for s in siblings]


def _cpu(engine: int, servers: list[list[int]]) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {"engine": sum(_cpu_seconds(p) for p in _descendants(engine, process_tree())),
           "client": usage.ru_utime + usage.ru_stime}
    for i, pids in enumerate(servers):
        out[f"server{i}"] = sum(_cpu_seconds(p) for p in pids)
    return out


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
