"""The router app's own work on a streamed chat request, warm and alone: the request driven through a real
uvicorn request cycle (over a transport that keeps nothing) into the router's app, routed by an entry with no
signals to one pool, its replica a fake answering two chunks (tests/support/fake_upstream.py). No sockets, no
other process: what the router's Python costs a request when nothing else runs (docs/router.md, "Added TTFT:
where the router's own time goes"). The collector is frozen and its young threshold raised as the server
does. `--profile` adds cProfile's top functions (their times then include the profiler's).

Usage: .venv/bin/python bench/router_app.py [--requests 5000] [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import pstats
import sys
import time
from pathlib import Path

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.fake_upstream import FakeUpstream, Reply

URL = "http://replica:8000"
CONFIG = {"listeners": [{"port": 8080}], "pools": {"p": {"model": "tiny", "replicas": [{"url": URL}]}},
          "entries": {"fleet": {"default": ["p"]}}}
BODY = (b'{"model":"fleet","messages":[{"role":"user","content":"Hello there, how are you?"}],'
        b'"max_tokens":16,"stream":true}')
CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
_log = logging.getLogger("bench")


class _Transport:
    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def _one(app: RouterApp, upstream: FakeUpstream) -> None:
    transport = _Transport()
    cycle = RequestResponseCycle(
        {"type": "http", "method": "POST", "path": "/v1/chat/completions", "http_version": "1.1",  # type: ignore[typeddict-item]
         "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                     (b"content-length", str(len(BODY)).encode())],
         "server": ("127.0.0.1", 8080), "query_string": b"", "root_path": "", "scheme": "http",
         "client": ("127.0.0.1", 5000)},
        transport, FlowControl(transport), _log, _log, False, [], asyncio.Event(), False, True,  # type: ignore[arg-type]
        lambda: None)
    cycle.body, cycle.more_body = BODY, False
    cycle.message_event.set()  # the body is here, as uvicorn has it when it came with the head
    await app(cycle.scope, cycle.receive, cycle.send)
    upstream.sent.clear()  # the fake keeps what it was sent: not here
    upstream.responses.clear()


async def main(args: argparse.Namespace) -> None:
    router = Router(parse_config(CONFIG))
    pools = build_pools(router.config)
    upstream = FakeUpstream()
    upstream.answer(URL, Reply(chunks=(CHUNK, b"data: [DONE]\n\n"), content_type="text/event-stream"))
    app = RouterApp(router.config, router, pools, upstream, RouterMetrics(pools), body_workers=1)
    try:
        await asyncio.wait_for(_one(app, upstream), 10)
        for _ in range(500):
            await _one(app, upstream)
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, *gc.get_threshold()[1:])
        t0 = time.perf_counter()
        for _ in range(args.requests):
            await _one(app, upstream)
        elapsed = time.perf_counter() - t0
        print(f"router app, warm and alone: {elapsed / args.requests * 1e6:.1f} us a streamed chat request "
              f"({args.requests} requests)")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.requests):
                await _one(app, upstream)
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    finally:
        app.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--profile", action="store_true")
    asyncio.run(main(ap.parse_args()))
