"""The router's own time on a streamed request's way to its first byte, by phase, from timestamps taken in
the router process: what the added TTFT of bench/router_latency.py is made of (docs/router.md, "Added TTFT:
where the router's own time goes").

The router runs this script with `--serve` (services.router's main, a few of its functions wrapped to
stamp the time) in front of the test backend, the backend's chunks paced as in router_latency.py; this
client sends streamed chat requests over `--streams` connections for `--seconds`, arrivals in step or
`--spread`. Phases, per request (p50 / p10 / p90 in us):
  read     the request's bytes through uvicorn's data_received (httptools' parse, the task made)
  queue    from there to the app's call: the task waiting its turn on the loop
  app      the app, to the upstream request's write (body, routing, dispatch)
  upstream the replica's time to its response head (the backend's, not the router's)
  wake     from the head's parse to the request's task running again
  head     from there to the client's head written (with the first chunk, when it came with the head)
  own      all but upstream
These are the ASGI path's phases: the lane (listeners/lane.py, no task, no app call) is off in the stamped
router; bench/router_lane.py measures the two paths' work in process. `--lane` keeps the lane on and stamps
its phases instead:
  read     from the request's bytes in (uvicorn's data_received) to the lane's take (httptools, the cycle)
  decide   the take to the upstream write (the body's parse, access, the decision, the lease, the payload)
  write    the upstream request's write (http1 send: its bytes and the syscall)
  upstream the write's end to the response head parsed (the backend's, not the router's)
  head     from there to the client's head written (with the first chunk when it came with the head)
  own      all but upstream
A request whose first chunk did not come with upstream's head has its head written alone; `head` then ends
there too (the count of each is printed). The wrapped functions are private: a rename makes this script
fail at start, not measure wrong.

Usage: .venv/bin/python bench/router_path.py [--streams 4] [--chunks 16] [--seconds 10] [--spread] [--lane]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PHASES = ("read", "queue", "app", "upstream", "wake", "head", "own")
LANE_PHASES = ("read", "decide", "write", "upstream", "head", "own")


def serve_lane(argv: list[str], out: str) -> None:
    """The router with its lane, stamped (`--lane`); SIGUSR1 as `serve`."""
    from services.router.backends import http1
    from services.router.listeners import connections, lane

    now = time.perf_counter_ns
    arrived: dict[int, int] = {}  # a client transport's last POST: its bytes' arrival
    taking: dict[str, int] | None = None  # the request the lane is taking now
    pending: dict[int, dict[str, int]] = {}  # a lane request's stamps, by its upstream connection
    done: dict[str, list[int]] = {name: [] for name in (*LANE_PHASES, "with_first", "alone")}
    protocol = connections._GuardedHttpTools
    data_received = protocol.data_received

    def stamped_data_received(self: Any, data: bytes) -> None:
        if data[:5] == b"POST ":
            arrived[id(self.transport)] = now()
        data_received(self, data)

    protocol.data_received = stamped_data_received  # type: ignore[method-assign]
    take = lane.Lane.take

    def stamped_take(self: Any, cycle: Any, connection: Any) -> bool:
        nonlocal taking
        taking = {"in": arrived.get(id(cycle.transport), 0), "take": now()}
        try:
            return take(self, cycle, connection)
        finally:
            taking = None

    lane.Lane.take = stamped_take  # type: ignore[method-assign]
    send = http1.Http1Client.send

    def stamped_send(self: Any, base_url: str, conn: Any, *args: Any) -> None:
        stamps = taking
        if stamps is not None:
            stamps["write"] = now()
        send(self, base_url, conn, *args)
        if stamps is not None and stamps["in"]:
            stamps["sent"] = now()
            pending[id(conn)] = stamps

    http1.Http1Client.send = stamped_send  # type: ignore[method-assign]
    headers_complete = http1.Connection.on_headers_complete

    def stamped_headers(self: Any) -> None:
        stamps = pending.get(id(self))
        if stamps is not None:
            stamps["head"] = now()
        headers_complete(self)

    http1.Connection.on_headers_complete = stamped_headers  # type: ignore[method-assign]
    write = lane._Stream._write

    def stamped_write(self: Any, data: bytes) -> bool:
        wrote = write(self, data)
        stamps = pending.pop(id(self.conn), None)
        if stamps is not None and "head" in stamps:
            out = now()
            done["read"].append(stamps["take"] - stamps["in"])
            done["decide"].append(stamps["write"] - stamps["take"])
            done["write"].append(stamps["sent"] - stamps["write"])
            done["upstream"].append(stamps["head"] - stamps["sent"])
            done["head"].append(out - stamps["head"])
            done["own"].append(out - stamps["in"] - (stamps["head"] - stamps["sent"]))
            done["alone" if data.endswith(b"\r\n\r\n") else "with_first"].append(1)
        return wrote

    lane._Stream._write = stamped_write  # type: ignore[method-assign]

    def report(*_: Any) -> None:
        Path(out).write_text(json.dumps(done))
        for values in done.values():
            values.clear()
        pending.clear()

    signal.signal(signal.SIGUSR1, report)
    from services.router.__main__ import main
    main(argv)


def serve(argv: list[str], out: str) -> None:
    """The router, stamped; SIGUSR1 writes the phases so far to `out` (JSON) and starts them afresh."""
    from services.router import app as app_module
    from services.router.backends import http1
    from services.router.listeners import connections, lane, relay
    from services.router.listeners.call import Call

    lane.Lane.wants = lambda self, scope: False  # type: ignore[method-assign]  # the ASGI path's phases

    now = time.perf_counter_ns
    arrived: dict[int, tuple[int, int]] = {}  # a client transport's last request: (bytes in, parsed)
    current: dict[Any, dict[str, int]] = {}  # a request's stamps, by its task
    done: dict[str, list[int]] = {name: [] for name in (*PHASES, "with_first", "alone")}

    protocol = connections._GuardedHttpTools
    data_received = protocol.data_received

    def stamped_data_received(self: Any, data: bytes) -> None:
        start = now()
        data_received(self, data)
        if data[:5] == b"POST ":
            arrived[id(self.transport)] = (start, now())

    protocol.data_received = stamped_data_received  # type: ignore[method-assign]

    app_call = app_module.RouterApp.__call__

    async def stamped_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        called = now()
        cycle = connections.cycle_of(receive)
        seen = arrived.get(id(cycle.transport)) if cycle is not None else None
        task = asyncio.current_task()
        if seen is not None:
            current[task] = {"in": seen[0], "parsed": seen[1], "called": called}
        try:
            await app_call(self, scope, receive, send)
        finally:
            stamps = current.pop(task, None)
            if stamps is not None and {"post", "head", "woken", "out"} <= stamps.keys():
                done["read"].append(stamps["parsed"] - stamps["in"])
                done["queue"].append(stamps["called"] - stamps["parsed"])
                done["app"].append(stamps["post"] - stamps["called"])
                done["upstream"].append(stamps["head"] - stamps["post"])
                done["wake"].append(stamps["woken"] - stamps["head"])
                done["head"].append(stamps["out"] - stamps["woken"])
                done["own"].append(stamps["out"] - stamps["in"] - (stamps["head"] - stamps["post"]))
                done["with_first" if stamps.get("first") else "alone"].append(1)

    app_module.RouterApp.__call__ = stamped_call  # type: ignore[method-assign]

    post = http1.Http1Client.post

    async def stamped_post(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamps = current.get(asyncio.current_task())
        if stamps is not None:
            stamps["post"] = now()
        response = await post(self, *args, **kwargs)
        if stamps is not None:
            stamps["woken"], stamps["head"] = now(), response._conn.head_at  # type: ignore[attr-defined]
        return response

    http1.Http1Client.post = stamped_post  # type: ignore[method-assign]

    headers_complete = http1.Connection.on_headers_complete

    def stamped_headers(self: Any) -> None:
        self.head_at = now()
        headers_complete(self)

    http1.Connection.on_headers_complete = stamped_headers  # type: ignore[method-assign]

    with_first = relay.start_with_first

    async def stamped_with_first(*args: Any) -> bool:
        wrote = await with_first(*args)
        stamps = current.get(asyncio.current_task())
        if stamps is not None:
            stamps["out"], stamps["first"] = now(), int(wrote)
        return wrote

    relay.start_with_first = stamped_with_first  # type: ignore[assignment]

    start = Call.start

    async def stamped_start(self: Any, send: Any, status: int, headers: Any) -> None:
        await start(self, send, status, headers)
        stamps = current.get(asyncio.current_task())
        if stamps is not None and "out" not in stamps:
            stamps["out"] = now()  # the head alone (start_with_first then stamps it again, later)

    Call.start = stamped_start  # type: ignore[method-assign]

    def report(*_: Any) -> None:
        Path(out).write_text(json.dumps(done))
        for values in done.values():
            values.clear()

    signal.signal(signal.SIGUSR1, report)
    from services.router.__main__ import main
    main(argv)


def run(args: argparse.Namespace) -> None:
    import router_latency as rl

    from tests.support.procs import HttpProc, free_port_block, start_backend

    with tempfile.TemporaryDirectory(prefix="bench-router-path-") as tmp_name:
        tmp = Path(tmp_name)
        backend = start_backend(tmp, "a")
        router: HttpProc | None = None
        try:
            rl.configure_backend(backend.url, {"chunks": args.chunks, "chunk_delay_s": args.chunk_ms / 1000,
                                               "reply": "x" * args.chunks})
            port = free_port_block(1, spread=0)
            config = tmp / "router.yaml"
            config.write_text(f"""
listeners: [{{port: {port}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, replicas: [{{url: "{backend.url}"}}], max_inflight: {2 * args.streams}}}
entries:
  fleet: {{default: [p]}}
""")
            stats = tmp / "phases.json"
            log_path = tmp / "router.log"
            with open(log_path, "wb") as log:
                mode = "--serve-lane" if args.lane else "--serve"
                proc = subprocess.Popen([sys.executable, __file__, mode, str(stats), "--config", str(config)],
                                        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                                        stderr=subprocess.STDOUT)
            router = HttpProc(proc, port, log_path)
            router.wait_http()
            body = (b'{"model":"fleet","messages":[{"role":"user","content":"Hello there, how are you?"}],'
                    b'"max_tokens":%d,"stream":true}' % args.chunks)
            length = (args.chunks + 1) * args.chunk_ms / 1000  # one request's paced length, [DONE] included
            per_stream = max(1, int(args.seconds / length))
            spread = args.chunks * args.chunk_ms / 1000 if args.spread else 0.0
            rl.run_loop_value(rl.stream_round(port, body, args.streams, 2, {}))  # warm-up
            proc.send_signal(signal.SIGUSR1)  # the warm-up's stamps dropped
            _wait_for(stats)
            stats.unlink()
            result = rl.run_loop_value(rl.stream_round(port, body, args.streams, per_stream, {}, spread))
            proc.send_signal(signal.SIGUSR1)
            _wait_for(stats)
            phases = json.loads(stats.read_text())
        finally:
            if router is not None:
                router.stop()
            backend.stop()
    ttft = sorted(result.ttft)
    print(f"router path: {args.streams} streams x {args.chunks} chunks paced {args.chunk_ms:g} ms, "
          f"{'spread' if args.spread else 'in step'}, {len(ttft)} requests; client TTFT p50 "
          f"{statistics.median(ttft):.3f} ms through the router")
    print(f"heads written with the first chunk {len(phases['with_first'])}, alone {len(phases['alone'])}")
    print("phase        p50 us    p10 us    p90 us")
    for name in LANE_PHASES if args.lane else PHASES:
        values = sorted(phases[name])
        if values:
            p = [values[min(len(values) - 1, int(q * len(values)))] / 1000 for q in (0.5, 0.1, 0.9)]
            print(f"{name:<9} {p[0]:9.1f} {p[1]:9.1f} {p[2]:9.1f}")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the router wrote no phases (see its log)")
        time.sleep(0.05)
    time.sleep(0.1)  # written whole


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] in ("--serve", "--serve-lane"):
        (serve_lane if sys.argv[1] == "--serve-lane" else serve)(sys.argv[3:], sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=16, help="content chunks per stream ([DONE] besides)")
    ap.add_argument("--chunk-ms", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=10.0, help="about how long the measured round runs")
    ap.add_argument("--spread", action="store_true", help="stagger the streams' first requests (router_latency.py)")
    ap.add_argument("--lane", action="store_true", help="the lane on, its phases stamped (else the ASGI path's)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
