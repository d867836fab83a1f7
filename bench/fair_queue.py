"""A pool's fair queue, side by side in one run: a router process in front of delayed test backends
(tests/support/openai_backend.py; each request holds a replica slot for --delay seconds), one router per
mode, the modes run in turn against the same backends:

- fair: the queue (queue_size), the two API keys two tenants: served in turn;
- fifo: the same queue and router code, both keys one tenant (`tenant:` in their key settings), so the
  queue is first come, first served: the honest baseline, by configuration alone;
- none: queue_size 0, today's behaviour: 429 at once when every replica is at its cap.

(1) Two tenants, one flooding: the flood keeps --flood requests in flight (a 429 retried after 10 ms),
the quiet tenant sends one request at a time; the quiet tenant's p50 / p99 latency and share refused.
(2) A burst of 3x the pool's capacity at once: share answered vs refused, and the answered ones' latency
(after one burst not counted, which opens the connections).
Usage: .venv/bin/python bench/fair_queue.py [--seconds 8] [--delay 0.1] [--replicas 2] [--max-inflight 4]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from tests.support.procs import HttpProc, start_backend, start_router  # noqa: E402

MODES = ("fair", "fifo", "none")
BODY = {"model": "fleet", "messages": [{"role": "user", "content": "Hello there, how are you?"}], "max_tokens": 8}


def _config(mode: str, backends: list[HttpProc], max_inflight: int, queue_size: int) -> str:
    tenants = ("flood", "quiet") if mode == "fair" else ("shared", "shared")
    replicas = ", ".join(f"{{url: {b.url}}}" for b in backends)
    return f"""
listeners:
  - port: {{port}}
    host: 127.0.0.1
    api_keys: [k-flood, k-quiet]
    keys:
      - {{key: k-flood, name: flood, tenant: {tenants[0]}}}
      - {{key: k-quiet, name: quiet, tenant: {tenants[1]}}}
admission:
  priorities: [{{name: standard, queue_ttl_s: 60}}]
pools:
  p:
    model: m
    replicas: [{replicas}]
    max_inflight: {max_inflight}
    queue_size: {0 if mode == "none" else queue_size}
    health: {{interval_s: 1, timeout_s: 2}}
entries:
  fleet: {{default: [p]}}
"""


async def _post(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, float]:
    started = time.perf_counter()
    async with session.post(url, json=BODY, headers={"authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status, time.perf_counter() - started


async def _flood_vs_quiet(url: str, seconds: float, flood: int) -> dict[str, float]:
    stop = time.monotonic() + seconds
    quiet: list[tuple[int, float]] = []
    flood_done = [0, 0]  # answered, refused
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def flooder() -> None:
            while time.monotonic() < stop:
                status, _ = await _post(session, url, "k-flood")
                flood_done[status != 200] += 1
                if status != 200:
                    await asyncio.sleep(0.01)  # a client retrying a 429 soon, not at once

        async def quiet_one() -> None:
            await asyncio.sleep(1.0)  # the flood's backlog built first
            while time.monotonic() < stop:
                quiet.append(await _post(session, url, "k-quiet"))

        await asyncio.gather(*(flooder() for _ in range(flood)), quiet_one())
    ok = [s for status, s in quiet if status == 200]
    return {"quiet_sent": len(quiet), "quiet_refused": 1 - len(ok) / max(1, len(quiet)),
            "quiet_p50_ms": percentile(ok, 0.5) * 1e3 if ok else float("nan"),
            "quiet_p99_ms": percentile(ok, 0.99) * 1e3 if ok else float("nan"),
            "flood_answered": flood_done[0], "flood_refused": flood_done[1]}


async def _bursts(url: str, size: int, rounds: int, delay: float) -> dict[str, float]:
    answered: list[float] = []
    refused = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(rounds + 1):
            results = await asyncio.gather(*(_post(session, url, "k-flood") for _ in range(size)))
            await asyncio.sleep(delay * 2)  # the pool idle again between bursts
            if i == 0:
                continue  # a warm-up: the connections opened
            answered += [s for status, s in results if status == 200]
            refused += sum(1 for status, _ in results if status != 200)
    total = size * rounds
    return {"answered": len(answered) / total, "refused": refused / total,
            "p50_ms": percentile(answered, 0.5) * 1e3, "p99_ms": percentile(answered, 0.99) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of the flood scenario per mode")
    ap.add_argument("--delay", type=float, default=0.1, help="seconds each request holds a replica slot")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--max-inflight", type=int, default=4)
    ap.add_argument("--flood", type=int, default=32, help="the flooding tenant's requests in flight")
    ap.add_argument("--bursts", type=int, default=5)
    args = ap.parse_args()
    capacity = args.replicas * args.max_inflight
    with tempfile.TemporaryDirectory() as tmp:
        backends = [start_backend(Path(tmp), f"b{i}") for i in range(args.replicas)]
        routers: dict[str, HttpProc] = {}
        try:
            for b in backends:
                b.configure(delay_s=args.delay)
            for mode in MODES:
                routers[mode] = start_router(Path(tmp), _config(mode, backends, args.max_inflight, 4 * capacity))
            print(f"pool: {args.replicas} replicas x max_inflight {args.max_inflight} = capacity {capacity}; "
                  f"each request holds its slot {args.delay * 1e3:.0f} ms")
            print(f"\n(1) flooding tenant ({args.flood} in flight) vs a quiet one (1 at a time), {args.seconds:g} s "
                  "per mode")
            print(f"{'mode':6} {'quiet p50 ms':>13} {'quiet p99 ms':>13} {'quiet refused':>14} {'quiet sent':>11} "
                  f"{'flood ok':>9} {'flood 429':>10}")
            for mode in MODES:
                url = routers[mode].url + "/v1/chat/completions"
                r = asyncio.run(_flood_vs_quiet(url, args.seconds, args.flood))
                print(f"{mode:6} {r['quiet_p50_ms']:13.0f} {r['quiet_p99_ms']:13.0f} {r['quiet_refused']:14.1%} "
                      f"{r['quiet_sent']:11.0f} {r['flood_answered']:9.0f} {r['flood_refused']:10.0f}")
            size = 3 * capacity
            print(f"\n(2) bursts of {size} requests at once (3x capacity), {args.bursts} bursts per mode")
            print(f"{'mode':6} {'answered':>9} {'refused':>8} {'p50 ms':>7} {'p99 ms':>7}")
            for mode in ("fair", "none"):
                url = routers[mode].url + "/v1/chat/completions"
                r = asyncio.run(_bursts(url, size, args.bursts, args.delay))
                print(f"{mode:6} {r['answered']:9.1%} {r['refused']:8.1%} {r['p50_ms']:7.0f} {r['p99_ms']:7.0f}")
        finally:
            for p in (*routers.values(), *backends):
                p.stop()


if __name__ == "__main__":
    main()
