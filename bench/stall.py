"""A stall of one engine rank of two (SIGSTOP for --stall-s seconds, then SIGCONT: a long GC pause, a
noisy neighbour) under N concurrent streams, through one frontend with its default deadlines: how many
streams failed, how many short requests sent during the stall failed and which ranks served them, and
what /ready answered meanwhile. Sim engines (--sim-decode-ms 5), all processes on this machine.

Usage: .venv/bin/python bench/stall.py [--streams 16] [--stall-s 3] [--root CHECKOUT]
--root runs the engines and the frontend of another checkout (a clone of main, say): its code, this
script's driver.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import free_port_block, start_engine, start_frontend  # noqa: E402

SIM = ("--model", "tiny", "--backend", "sim", "--sim-decode-ms", "5")


def _stream(url: str, max_tokens: int, started: threading.Barrier) -> tuple[str, str | None]:
    """(the rank that served it, its error message or None)."""
    rank, error, waited = "?", None, False
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=120,
                          json={"model": "tiny", "prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
            rank = r.headers.get("x-data-parallel-rank", "?")
            if r.status_code != 200:
                return rank, f"HTTP {r.status_code}: {r.read()[:200]!r}"
            events = 0
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events += 1
                    body = json.loads(line[6:])
                    if "error" in body:
                        error = body["error"]["message"]
                    if events == 3 and not waited:
                        waited = True
                        started.wait()
    except (httpx.HTTPError, threading.BrokenBarrierError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if not waited:
            started.abort()
    return rank, error


def _short(url: str) -> tuple[str, int, float]:
    t0 = time.monotonic()
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60)
        return r.headers.get("x-data-parallel-rank", "-"), r.status_code, time.monotonic() - t0
    except httpx.HTTPError:
        return "-", 0, time.monotonic() - t0


def _all_ready(url: str) -> bool:
    try:
        r = httpx.get(url + "/ready", timeout=2)
    except httpx.TransportError:
        return False
    return r.status_code == 200 and "missing" not in r.json()


def run(tmp: Path, streams: int, stall_s: float) -> dict[str, Any]:
    base = free_port_block(2)
    ranks = [start_engine(tmp, *SIM, "--data-parallel-start-rank", str(i), port=base + i) for i in range(2)]
    fe = start_frontend(tmp, "--data-parallel-size", "2", "--data-parallel-size-local", "0", "--engine-addresses",
                        f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}", wait_status=None)
    pool = ThreadPoolExecutor(streams + 4)
    victim = ranks[1].proc.pid
    stopped = False
    try:
        deadline = time.monotonic() + 120
        while not _all_ready(fe.url):
            if time.monotonic() > deadline:
                raise TimeoutError("the frontend never had both ranks ready")
            time.sleep(0.1)
        started = threading.Barrier(streams + 1, timeout=60)
        # Long enough to run through the stall: 5 ms a token, well past stall_s.
        max_tokens = int((stall_s + 3) * 1000 / 5)
        running = [pool.submit(_stream, fe.url, max_tokens, started) for _ in range(streams)]
        started.wait()
        os.kill(victim, signal.SIGSTOP)
        stopped, stopped_at = True, time.monotonic()
        shorts: list[Future[tuple[str, int, float]]] = []
        ready: Counter[int] = Counter()
        while time.monotonic() - stopped_at < stall_s:
            shorts.append(pool.submit(_short, fe.url))
            ready[httpx.get(fe.url + "/ready", timeout=5).status_code] += 1
            time.sleep(0.1)
        os.kill(victim, signal.SIGCONT)
        stopped = False
        results = [f.result(timeout=120) for f in running]
        answers = [f.result(timeout=120) for f in shorts]
        on_victim = [r for r in results if r[0] == "1"]
        return {
            "streams": streams, "streams_on_stopped_rank": len(on_victim),
            "streams_failed": sum(r[1] is not None for r in results),
            "streams_failed_on_stopped_rank": sum(r[1] is not None for r in on_victim),
            "first_error": next((r[1] for r in results if r[1] is not None), None),
            "requests_during_stall": len(answers), "requests_failed": sum(a[1] != 200 for a in answers),
            "requests_by_rank": dict(Counter(a[0] for a in answers if a[1] == 200)),
            "request_latency_max_s": round(max((a[2] for a in answers), default=0.0), 2),
            "ready_answers_during_stall": dict(ready),
        }
    finally:
        if stopped:
            os.kill(victim, signal.SIGCONT)
        pool.shutdown(wait=False, cancel_futures=True)
        fe.stop()
        for rank in ranks:
            rank.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16, help="concurrent streams when the rank stops")
    p.add_argument("--stall-s", type=float, default=3.0, help="seconds the rank stays stopped")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose engines and frontend run")
    args = p.parse_args()
    root = args.root.resolve()
    os.chdir(root)  # `python -m services...` runs the code of the working directory
    os.environ["PYTHONPATH"] = str(root)
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(Path(tmp), args.streams, args.stall_s)
    print(f"checkout {root}: SIGSTOP {args.stall_s:g} s on rank 1 of 2, {args.streams} concurrent streams")
    for key, value in figures.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
