"""The router's request path in process, warm and alone, by the lane and by the ASGI path: a streamed chat
request fed to the router's own uvicorn protocol over a transport that keeps nothing, sent upstream on a
kept-alive connection of the router's HTTP/1 client (its transport keeps nothing either), and answered by
feeding that connection a replica's response (a head with the first chunk, then [DONE] and the end). No
sockets and no other process: the Python (and C) work a request costs the router, with the syscalls left
out. The ASGI path is the same router's with the lane off (listeners/lane.py; docs/router.md, "The lane").

Usage: .venv/bin/python bench/router_lane.py [--requests 5000] [--rounds 5] [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.server import ServerState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.router.app import RouterApp
from services.router.backends.aiohttp_upstream import AiohttpUpstream
from services.router.backends.http1 import Connection
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.listeners.connections import uvicorn_protocol
from services.router.metrics import RouterMetrics

URL = "http://127.0.0.1:9"
CONFIG = {"listeners": [{"port": 8080}], "pools": {"p": {"model": "tiny", "replicas": [{"url": URL}]}},
          "entries": {"fleet": {"default": ["p"]}}}
BODY = (b'{"model":"fleet","messages":[{"role":"user","content":"Hello there, how are you?"}],'
        b'"max_tokens":16,"stream":true}')
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%b" % (len(BODY), BODY))
CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
HEAD = (b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
FIRST = HEAD + b"%x\r\n%b\r\n" % (len(CHUNK), CHUNK)
LAST = b"%x\r\n%b\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")


class _Transport:
    """A transport that keeps nothing but how many writes it took."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


async def _one(protocol: Any, client: _Transport, upstream: _Transport, conn: Connection) -> None:
    written = upstream.writes
    protocol.data_received(REQUEST)
    while upstream.writes == written:  # the ASGI path: its task runs, and writes upstream
        await asyncio.sleep(0)
    replied = client.writes
    conn.data_received(FIRST)
    conn.data_received(LAST)
    while protocol.cycle is None or not protocol.cycle.response_complete or client.writes == replied:
        await asyncio.sleep(0)  # the ASGI path: its task takes the head, then the end


async def measure(lane: bool, requests: int, rounds: int, profile: bool) -> list[float]:
    loop = asyncio.get_running_loop()
    router = Router(parse_config(CONFIG))
    pools = build_pools(router.config)
    upstream = AiohttpUpstream()
    app = RouterApp(router.config, router, pools, upstream, RouterMetrics(pools), body_workers=1)
    config = uvicorn.Config(app, http=uvicorn_protocol(10.0, 100, app.lane if lane else None), loop="none",
                            lifespan="off", access_log=False, log_config=None, proxy_headers=False)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    client = _Transport()
    protocol.connection_made(client)
    conn = Connection(loop)
    up = _Transport()
    conn.connection_made(up)  # type: ignore[arg-type]
    upstream.http1.give_back_to(URL, conn)
    try:
        for _ in range(500):
            await _one(protocol, client, up, conn)
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, *gc.get_threshold()[1:])
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(requests):
                await _one(protocol, client, up, conn)
            out.append((time.perf_counter() - t0) / requests * 1e6)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(requests):
                await _one(protocol, client, up, conn)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return out
    finally:
        gc.unfreeze()
        app.close()
        await upstream.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile's top functions of the lane")
    args = ap.parse_args()
    import uvloop

    times = {}
    for name, lane in (("ASGI path", False), ("lane", True)):
        times[name] = uvloop.run(measure(lane, args.requests, args.rounds, args.profile and lane))
    print(f"router request path in process, warm (a streamed chat request, 2 chunks; medians of {args.rounds} "
          f"rounds of {args.requests}):")
    for name, values in times.items():
        print(f"  {name:<10} {statistics.median(values):6.1f} us a request  "
              f"(rounds {', '.join(f'{v:.1f}' for v in values)})")
    print(f"  lane / ASGI path x{statistics.median(times['lane']) / statistics.median(times['ASGI path']):.2f}")


if __name__ == "__main__":
    main()
