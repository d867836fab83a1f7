"""Isolation: do other streams keep flowing while the frontend takes the heaviest requests it allows?

Starts a sim engine paced like a GPU (one token per stream per --step-ms step) and a frontend, as
separate processes, and keeps --streams chat streams running. After a quiet window it sends, beside
them, each hostile request in turn: the largest body allowed (--max-body-bytes) as one long message,
the same body as many short messages, and the largest stop list allowed. For the running streams
it prints the inter-token gap (p50, p99, max) in the quiet window and while each hostile request was
in flight, and whether any stream failed. Target (issue 9): none fails, p99 during <= 2x before,
max gap under 100 ms.

The hostile requests may be refused (a 4 MiB prompt exceeds the sim's context): what counts is
that the frontend parsed, rendered and tokenized them, and what that did to everyone else.

`--router`: the same through a router process in front of the frontend (one pool, one replica), so
the router's reading of each hostile body counts too; `--router-at REV`: the router of git revision
REV (a worktree under /tmp) in front of this checkout's frontend, to compare before and after.
Usage: python bench/isolation.py [--streams 64] [--step-ms 20] [--quiet-s 3] [--router | --router-at REV]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
from frontend_stream import _free_port, tree_at, wait_ready
from timing import percentile

ROOT = Path(__file__).resolve().parent.parent
MAX_BODY = 4 * 2**20  # the frontend's default --max-body-bytes


def _stop_limits() -> tuple[int, int]:
    """The frontend's documented limits on stop strings (count, characters each), if it has them."""
    sys.path.insert(0, str(ROOT))
    try:
        from services.frontend.text import stop_strings
    except ImportError:
        return 16, 5000
    count = getattr(stop_strings, "MAX_STOP_STRINGS", 16)
    total = getattr(stop_strings, "MAX_STOP_CHARS", None)
    return count, total // count if total else 5000  # the largest list: every string as long as allowed


def hostile_bodies() -> dict[str, bytes]:
    """name -> a body as large as the frontend accepts."""
    def fill(make: object, unit: int) -> bytes:
        assert callable(make)
        n = MAX_BODY // unit
        while True:
            body = json.dumps(make(n)).encode()
            if len(body) <= MAX_BODY - 64:
                return body
            n = int(n * 0.97)

    words = "naïve words, code {json} and 日本語 "
    one = fill(lambda n: {"model": "tiny", "max_tokens": 1,
                          "messages": [{"role": "user", "content": words * n}]}, len(words.encode()) + 1)
    many = fill(lambda n: {"model": "tiny", "max_tokens": 1,
                           "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi there"}
                                        for i in range(n)]}, 46)
    count, chars = _stop_limits()
    stops = [f"{i:04d}" + "z" * (chars - 4) for i in range(count)]
    stop = json.dumps({"model": "tiny", "max_tokens": 50, "stop": stops,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    return {"one 4 MiB message": one, "4 MiB of short messages": many,
            f"{count} stop strings of {chars} chars": stop}


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes, times: list[float],
                  failures: list[str]) -> None:
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                failures.append(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                return
            done = False
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: "):
                    if b'"error"' in line[:20]:
                        failures.append(line.decode()[:200])
                    times.append(time.monotonic())
            if not done:
                failures.append("the stream ended without [DONE]")
    except aiohttp.ClientError as exc:
        failures.append(repr(exc))


def _gaps(streams: list[list[float]], start: float, end: float) -> list[float]:
    return [(b - a) * 1e3 for times in streams for a, b in zip(times, times[1:], strict=False) if start <= b <= end]


def _line(label: str, gaps: list[float], base_p99: float | None = None) -> str:
    p50, p99 = percentile(gaps, 0.5), percentile(gaps, 0.99)
    ratio = f"  p99 x{p99 / base_p99:.2f} of quiet" if base_p99 else ""
    return (f"  {label:<34} gaps {len(gaps):>6}  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
            f"max {max(gaps, default=float('nan')):7.1f} ms{ratio}")


async def run(base: str, streams: int, step_ms: float, quiet_s: float) -> None:
    url = base + "/v1/chat/completions"
    bodies = hostile_bodies()
    tokens = int((quiet_s + 10 * (len(bodies) + 1)) * 1000 / step_ms)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}],
                       "max_tokens": tokens, "ignore_eos": True, "stream": True}).encode()
    times: list[list[float]] = [[] for _ in range(streams)]
    failures: list[str] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as session:
        running = [asyncio.create_task(_stream(session, url, body, times[i], failures)) for i in range(streams)]
        await asyncio.sleep(1.0)  # all streams under way
        quiet_start = time.monotonic()
        await asyncio.sleep(quiet_s)
        windows = [("quiet", quiet_start, time.monotonic(), "")]
        for name, hostile in bodies.items():
            t0 = time.monotonic()
            async with session.post(url, data=hostile, headers={"content-type": "application/json"}) as resp:
                text = await resp.text()
                outcome = f"HTTP {resp.status}" + ("" if resp.status == 200 else f" ({text[:90]}...)")
            t1 = time.monotonic()
            windows.append((name, t0, t1 + step_ms / 1000, f"{outcome}, answered in {(t1 - t0) * 1e3:.0f} ms"))
            await asyncio.sleep(1.0)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    base_p99 = percentile(_gaps(times, windows[0][1], windows[0][2]), 0.99)
    print(f"{streams} streams at one token per {step_ms:g} ms step (sim engine), other streams' inter-token gaps:")
    for name, start, end, outcome in windows:
        gaps = _gaps(times, start, end)
        print(_line(name, gaps, None if name == "quiet" else base_p99))
        if outcome:
            print(f"  {'':<34} the request: {outcome}")
    print(f"streams failed: {len(failures)}" + (f" (first: {failures[0]})" if failures else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--quiet-s", type=float, default=3.0)
    p.add_argument("--router", action="store_true", help="through a router in front of the frontend")
    p.add_argument("--router-at", metavar="REV", help="through the router of git revision REV")
    args = p.parse_args()
    engine_port, http_port = _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-decode-ms", str(args.step_ms), "--host", "127.0.0.1", "--port",
                               str(engine_port), "--pub-port", str(_free_port()), "--max-num-seqs", "512"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--data-parallel-size-local", "0",
                                 "--engine-addresses", f"tcp://127.0.0.1:{engine_port}", "--log-level", "warning"],
                                cwd=ROOT)
    base = f"http://127.0.0.1:{http_port}"
    procs = [frontend, engine]
    try:
        wait_ready(base)
        if args.router or args.router_at:
            router, base = _start_router(base, tree_at(args.router_at) if args.router_at else ROOT, args.streams)
            procs.insert(0, router)
            print(f"through the router of {args.router_at or 'this checkout'} ({base})")
        asyncio.run(run(base, args.streams, args.step_ms, args.quiet_s))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def _start_router(frontend: str, tree: Path, streams: int) -> tuple[subprocess.Popen[bytes], str]:
    """A router in `tree` with one pool (the frontend) and the entry "tiny"; its process and URL."""
    port = _free_port()
    config = Path(f"/tmp/isolation-router-{port}.yaml")
    config.write_text(f"""
listeners: [{{port: {port}, host: 127.0.0.1}}]
pools:
  tiny:
    model: tiny
    replicas: [{{url: "{frontend}"}}]
    max_inflight: {streams + 16}
entries:
  tiny: {{default: [tiny]}}
""")
    router = subprocess.Popen([sys.executable, "-m", "services.router", "--config", str(config)], cwd=tree)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(base + "/health", timeout=1).status == 200:
                return router, base
        except OSError:
            pass
        if time.monotonic() > deadline or router.poll() is not None:
            router.kill()
            raise TimeoutError(f"the router at {base} did not start")
        time.sleep(0.2)


if __name__ == "__main__":
    main()
