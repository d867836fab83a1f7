"""Detection times of the chaos cases (the faults tests/integration/test_frontend_faults.py and
test_router_fleet.py check), each a fresh fleet of sim engines, frontends and a router as processes:

- engine-kill: SIGKILL the rank serving a stream (frontend --engine-timeout 2): kill -> the stream's
  error event; requests sent right after the kill that failed; restart -> the rank ready again.
- unit-rank-kill: the same with a supervised unit (frontend --data-parallel-size-local 2), which
  starts the rank again by itself: kill -> rejoined.
- engine-drain: SIGTERM the rank serving two streams (--drain-timeout 2): the short one finishes,
  signal -> the long one's error event, signal -> the rank's exit.
- frontend-drain: SIGTERM the frontend (--shutdown-timeout 2): signal -> the long streams' error
  event, signal -> exit, tracebacks logged.
- router-replica-kill: SIGKILL one of two frontends behind the router under load (4 clients):
  kill -> its breaker open; requests that failed, requests retried; restart: its /ready 200 -> the
  router's first request to it (breaker cool-down --cooldown-s, default 600 s, so that only a health
  check can close it in time; 10 is the router's default).

Usage: .venv/bin/python bench/chaos.py [--runs 3] [--cases engine-kill,...] [--cooldown-s 600]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import (  # noqa: E402
    FrontendProc,
    free_port_block,
    pid_listening_on,
    start_engine,
    start_frontend,
    start_router,
)

SIM = ("--model", "tiny", "--backend", "sim")
Figures = dict[str, float]


def _completion(url: str) -> int:
    return httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                      timeout=30).status_code


def _stream(url: str, max_tokens: int, on_event: Callable[[int], Any] | None = None, **headers: str) -> list[Any]:
    """A streamed completion's data payloads ([DONE] kept as the string); on_event(n) after the n-th."""
    events: list[Any] = []
    with httpx.stream("POST", url + "/v1/completions", headers=headers, timeout=60,
                      json={"model": "tiny", "prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream refused: {r.status_code} {r.read()!r}")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if on_event is not None:
                    on_event(len(events))
    return events


def _until(ok: Callable[[], bool], timeout_s: float = 60.0) -> float:
    """Poll until ok(); when it became true (time.monotonic())."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError("condition never held")
        time.sleep(0.005)
    return time.monotonic()


def _ready(fe: FrontendProc) -> bool:
    try:
        return httpx.get(fe.url + "/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _kill_mid_stream(fe: FrontendProc, pid: int) -> tuple[float, float, int]:
    """SIGKILL `pid` at a rank-1 stream's 5th event, with 20 requests sent right after; (kill time,
    error event time, requests that failed)."""
    pool = ThreadPoolExecutor(4)
    marks: dict[str, float] = {}
    burst: list[Any] = []

    def at(n: int) -> None:
        if n == 5:
            marks["kill"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            burst.extend(pool.submit(_completion, fe.url) for _ in range(20))

    events = _stream(fe.url, 3000, at, **{"X-Data-Parallel-Rank": "1"})
    error_at = time.monotonic()
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-2:]
    failed = sum(f.result() != 200 for f in burst)
    pool.shutdown()
    return marks["kill"], error_at, failed


def engine_kill(tmp: Path) -> Figures:
    base = free_port_block(2)
    ranks = [start_engine(tmp, *SIM, "--sim-decode-ms", "5", "--data-parallel-start-rank", str(i), port=base + i)
             for i in range(2)]
    fe = start_frontend(tmp, "--data-parallel-size", "2", "--data-parallel-size-local", "0", "--engine-addresses",
                        f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}", "--engine-timeout", "2")
    try:
        killed, error_at, failed = _kill_mid_stream(fe, ranks[1].proc.pid)
        ranks[1].proc.wait(10)
        restarted = time.monotonic()
        ranks[1] = start_engine(tmp, *SIM, "--sim-instant", "--data-parallel-start-rank", "1", port=base + 1,
                                wait=False)
        back = _until(lambda: _ready(fe))
        return {"kill -> stream error (ms)": (error_at - killed) * 1000, "failed requests of 20": failed,
                "restart -> rank ready (ms)": (back - restarted) * 1000}
    finally:
        fe.stop()
        for r in ranks:
            r.stop()


def unit_rank_kill(tmp: Path) -> Figures:
    port = free_port_block(2)
    fe = start_frontend(tmp, "--backend", "sim", "--data-parallel-size-local", "2", "--engine-port", str(port),
                        "--engine-arg=--sim-decode-ms=5")
    try:
        killed, error_at, failed = _kill_mid_stream(fe, pid_listening_on(port + 1))
        back = _until(lambda: _ready(fe))
        return {"kill -> stream error (ms)": (error_at - killed) * 1000, "failed requests of 20": failed,
                "kill -> rank restarted and ready (ms)": (back - killed) * 1000}
    finally:
        fe.stop()


def _drain_streams(url: str, signal_it: Callable[[], None], **headers: str) -> tuple[float, list[Any], list[Any]]:
    """A short and a long stream; signal_it() once both have started. (signal time, short, long)."""
    started = threading.Barrier(3, timeout=30)
    with ThreadPoolExecutor(2) as pool:
        short, long = (pool.submit(_stream, url, n, lambda k: k == 3 and started.wait(), **headers)
                       for n in (100, 3000))
        started.wait()
        signalled = time.monotonic()
        signal_it()
        short_events = short.result(60)
        long_events = long.result(60)
    return signalled, short_events, long_events


def engine_drain(tmp: Path) -> Figures:
    base = free_port_block(2)
    ranks = [start_engine(tmp, *SIM, "--sim-decode-ms", "5", "--data-parallel-start-rank", str(i),
                          "--drain-timeout", "2", port=base + i) for i in range(2)]
    fe = start_frontend(tmp, "--data-parallel-size", "2", "--data-parallel-size-local", "0", "--engine-addresses",
                        f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}")
    try:
        signalled, short, long = _drain_streams(fe.url, lambda: ranks[1].proc.send_signal(signal.SIGTERM),
                                                **{"X-Data-Parallel-Rank": "1"})
        cut = time.monotonic()
        ranks[1].proc.wait(30)
        exited = time.monotonic()
        assert short[-2]["choices"][0]["finish_reason"] == "length" and "drain deadline" in long[-2]["error"]["message"]
        return {"signal -> long stream's error (ms)": (cut - signalled) * 1000,
                "signal -> rank exit (ms)": (exited - signalled) * 1000}
    finally:
        fe.stop()
        for r in ranks:
            r.stop()


def frontend_drain(tmp: Path) -> Figures:
    engine = start_engine(tmp, *SIM, "--sim-decode-ms", "5")
    fe = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--shutdown-timeout", "2")
    try:
        signalled, short, long = _drain_streams(fe.url, lambda: fe.proc.send_signal(signal.SIGTERM))
        cut = time.monotonic()
        fe.proc.wait(30)
        exited = time.monotonic()
        assert short[-2]["choices"][0]["finish_reason"] == "length" and long[-1] == "[DONE]"
        return {"signal -> long stream's error (ms)": (cut - signalled) * 1000,
                "signal -> exit (ms)": (exited - signalled) * 1000, "tracebacks": fe.log().count("Traceback")}
    finally:
        fe.stop()
        engine.stop()


COOLDOWN_S = 600.0


def router_replica_kill(tmp: Path) -> Figures:
    engines = [start_engine(tmp, *SIM, "--sim-decode-ms", "1") for _ in range(2)]
    args = [("--data-parallel-size-local", "0", "--engine-addresses", e.endpoint()) for e in engines]
    frontends = [start_frontend(tmp, *a) for a in args]
    router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  tiny:
    model: tiny
    replicas: [{", ".join(f"{{url: {fe.url}}}" for fe in frontends)}]
    health: {{path: /ready, interval_s: 0.5, timeout_s: 1}}
    breaker: {{failures: 2, cooldown_s: {COOLDOWN_S}}}
entries:
  assistant: {{default: [tiny]}}
""")
    victim = frontends[1]
    answers: list[tuple[float, int, str, str]] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = c.post(router.url + "/v1/chat/completions", json={
                    "model": "assistant", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
                answers.append((sent, r.status_code, r.headers.get("x-router-replica", ""),
                                r.headers.get("x-router-attempts", "")))

    def breaker_open() -> bool:
        state = httpx.post(router.url + "/v1/router/explain", timeout=10, json={
            "model": "assistant", "messages": [{"role": "user", "content": "hi"}]}).json()["replicas"]
        return next(r["breaker"] for r in state if r["url"] == victim.url) == "open"

    workers = [threading.Thread(target=load) for _ in range(4)]
    try:
        for w in workers:
            w.start()
        _until(lambda: {a[2] for a in answers} >= {fe.url for fe in frontends})
        killed = time.monotonic()
        victim.proc.kill()
        opened = _until(breaker_open)
        time.sleep(0.5)
        frontends[1] = victim = start_frontend(tmp, *args[1], port=victim.port)
        ready = time.monotonic()
        _until(lambda: any(a[0] > ready and a[2] == victim.url for a in answers), COOLDOWN_S + 60)
        used = min(a[0] for a in answers if a[0] > ready and a[2] == victim.url)
        stop.set()
        for w in workers:
            w.join(30)
        return {"kill -> breaker open (ms)": (opened - killed) * 1000,
                "failed requests": sum(a[1] != 200 for a in answers),
                "retried requests": sum(a[3] == "2" for a in answers),
                "replica ready -> used again (ms)": (used - ready) * 1000}
    finally:
        stop.set()
        for w in workers:
            w.join(30)
        router.stop()
        for proc in [*frontends, *engines]:
            proc.stop()


CASES: dict[str, Callable[[Path], Figures]] = {
    "engine-kill": engine_kill, "unit-rank-kill": unit_rank_kill, "engine-drain": engine_drain,
    "frontend-drain": frontend_drain, "router-replica-kill": router_replica_kill}


def main() -> None:
    global COOLDOWN_S
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--cooldown-s", type=float, default=COOLDOWN_S, help="router-replica-kill's breaker cool-down")
    args = parser.parse_args()
    COOLDOWN_S = args.cooldown_s
    for name in args.cases.split(","):
        runs: list[Figures] = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(CASES[name](Path(tmp)))
        print(f"{name} ({args.runs} runs: median, max)")
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f"  {key:42s} {statistics.median(values):10.0f} {max(values):10.0f}")


if __name__ == "__main__":
    main()
