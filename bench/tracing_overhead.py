"""Router CPU per request with tracing off and on, side by side in one run: three routers in front of one
zero-delay test backend, the same config each; one untraced, one tracing every request and exporting
OTLP/HTTP to a receiver process (tests/support/otlp_receiver.py), one configured to trace but sampling
nothing (always_off).
Non-streaming chat, alternating rounds; the router process's CPU time (utime + stime) over its requests,
and p50/p99 latency. The exported spans are counted, to show the traced router did export them.
Usage: .venv/bin/python bench/tracing_overhead.py [--requests 6000] [--rounds 6] [--concurrency 1,16]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import timeit
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router_latency import cpu_seconds, run_loop, run_round  # noqa: E402
from timing import percentile  # noqa: E402

import tracing  # noqa: E402
from tests.support.procs import HttpProc, _spawn, free_port_block, start_backend, start_router  # noqa: E402

CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, replicas: [{{url: "{url}"}}], max_inflight: 256}}
entries:
  fleet:
    signals:
      - {{name: hello, type: keyword, keywords: [hello]}}
    decisions:
      - {{name: greeting, when: hello, pools: [p]}}
    default: [p]
"""
OTEL_VARS = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


def start(tmp: Path, backend_url: str, env: dict[str, str], root: Path | None = None) -> HttpProc:
    """A router whose environment holds exactly these OTEL_* variables (start_router passes ours on);
    `root`: the router of another checkout (one without this tracing code, for a baseline)."""
    saved = {name: os.environ.pop(name) for name in OTEL_VARS if name in os.environ}
    os.environ.update(env)
    try:
        if root is None:
            return start_router(tmp, CONFIG.format(url=backend_url))
        port = free_port_block(1, spread=0)
        path = tmp / f"baseline-{port}.yaml"
        path.write_text(CONFIG.format(url=backend_url).replace("{port}", str(port)))
        with open(tmp / f"baseline-{port}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "services.router", "--config", str(path)], cwd=root,
                                    env={**os.environ, "PYTHONPATH": str(root)}, stdout=log,
                                    stderr=subprocess.STDOUT)
        router = HttpProc(proc, port, tmp / f"baseline-{port}.log")
        router.wait_http()
        return router
    finally:
        for name in env:
            del os.environ[name]
        os.environ.update(saved)


async def measure(routers: dict[str, HttpProc], concurrency: int, requests: int, rounds: int) -> None:
    per_round = max(concurrency, requests // rounds)
    for router in routers.values():  # warm-up: connections, the upstream pool, code paths
        await run_round(router.port, concurrency, max(200, concurrency * 4))
    samples: dict[str, list[float]] = {name: [] for name in routers}
    cpu = dict.fromkeys(routers, 0.0)
    for i in range(rounds):
        order = list(routers) if i % 2 == 0 else list(reversed(routers))  # drift favours none
        for name in order:
            pid = routers[name].proc.pid
            cpu0 = cpu_seconds(pid)
            latencies, _, errors = await run_round(routers[name].port, concurrency, per_round)
            cpu[name] += cpu_seconds(pid) - cpu0
            samples[name] += latencies
            if errors:
                print(f"     {name}: non-200 answers {errors}")
    cells = []
    for name, values in samples.items():
        values.sort()
        cells.append(f"{cpu[name] / len(values) * 1e6:7.0f} {percentile(values, 0.5):7.3f} "
                     f"{percentile(values, 0.99):7.3f}")
    base = cpu["off"] / len(samples["off"])
    added = (cpu["on"] / len(samples["on"]) - base) * 1e6
    print(f"{concurrency:>4}   " + "   ".join(cells) + f"   {added:+7.0f}")


def off_path_ns() -> float:
    """What one span call costs a router that does not trace (the tracer is None), in ns."""
    tracing.shutdown()
    n = 200_000
    return min(timeit.repeat(lambda: tracing.span("router.admission", {"router.pool": "p"}), number=n,
                             repeat=5)) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000, help="per router and concurrency, over all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="also a router run from this checkout (one without the tracing code, e.g. the commit "
                         "before it): what off costs next to no tracing code at all")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        port = free_port_block(1, spread=0)
        receiver = _spawn(Path(tmp), "otlp-receiver", [sys.executable, "-m", "tests.support.otlp_receiver",
                                                       "--port", str(port)], port)
        backend = start_backend(Path(tmp), "a")
        routers: dict[str, HttpProc] = {}
        try:
            receiver.wait_http("/stats")
            traced = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces",
                      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
            routers["off"] = start(Path(tmp), backend.url, {})
            routers["on"] = start(Path(tmp), backend.url, traced)
            routers["sampled out"] = start(Path(tmp), backend.url, {**traced, "OTEL_TRACES_SAMPLER": "always_off"})
            if args.baseline is not None:
                routers["baseline"] = start(Path(tmp), backend.url, {}, args.baseline.resolve())
            print(f"router CPU per request, tracing off vs on (OTLP/HTTP to a local receiver) vs on with "
                  f"OTEL_TRACES_SAMPLER=always_off; non-streaming chat to a zero-delay backend, {args.requests} "
                  f"requests per router and concurrency in {args.rounds} alternating rounds")
            print("conc   " + "".join(f"{name:^27}" for name in routers) + "  on - off")
            print("    " + "   CPU us  p50 ms  p99 ms" * len(routers) + "  CPU us/req")
            for c in [int(x) for x in args.concurrency.split(",")]:
                run_loop(measure(routers, c, args.requests, args.rounds))
        finally:
            for router in routers.values():
                router.stop()  # the traced one flushes its last batch on the way out
            backend.stop()
            try:
                with urllib.request.urlopen(f"{receiver.url}/stats", timeout=5) as r:
                    stats = json.load(r)
            finally:
                receiver.stop()
        print(f"exported: {stats['spans']} spans, {stats['router_requests']} router.request spans, in "
              f"{stats['exports']} OTLP requests (services: {stats['services']})")
    print(f"off: one span call costs {off_path_ns():.0f} ns (a None check); a request makes 5 of them")


if __name__ == "__main__":
    main()
