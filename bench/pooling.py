"""Embeddings through the fleet (a frontend with one managed vllm engine rank, --runner pooling) against
vLLM's own OpenAI API server, on the same checkpoint (all-MiniLM-L6-v2, `--model minilm`) and the same
engine limits, side by side in one run, in interleaved rounds.

Each request is POST /v1/embeddings with a batch of --batch inputs; N clients each send requests back to
back (a closed loop) for one round. Per server and N it prints requests/s and the CPU time of its HTTP
server process per request: the frontend process for the fleet (not its engine rank), vLLM's API server
process (not its EngineCore). vLLM runs as in production, EngineCore in its own process
(VLLM_ENABLE_V1_MULTIPROCESSING unset), which is what makes the two HTTP servers measurable apart: with
it set to 0 vLLM's engine would share the API server's process and its CPU. CPU is net of each process's
idle CPU over the round's wall time (raw beside it); the engine side's CPU per request is printed too.
Processes are started, found, measured and stopped with bench/vs_vllm.py's helpers.
Usage: python bench/pooling.py [--concurrency 1,64] [--batch 16] [--requests 16] [--repeat 2]
                               [--max-model-len 256] [--kv-cache-bytes 16777216] [--idle-s 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from frontend_stream import _free_port
from vs_vllm import Server, _cpu_of, _get, _spawn, cpu_s, describe, listener, net_cpu_s, settle, stop, tree, wait_ready

import checkpoints

MODEL = "minilm"
# Sentences of 8 to 30 tokens, so a batch of 16 is a few hundred tokens: the size of a router's
# embedding lookups, not a document-indexing job.
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Write a Python function that returns the n-th Fibonacci number without recursion.",
    "What is the derivative of x cubed plus two x, evaluated at x equals three?",
    "Summarize the following meeting notes in three bullet points for the leadership team.",
    "Translate 'where is the train station' into French, German and Spanish.",
    "Why does my Rust program fail to compile with a borrow checker error on this loop?",
    "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
    "Which is heavier, a kilogram of feathers or a kilogram of steel, and why do people get it wrong?",
    "Explain the difference between TCP and UDP to a first-year student.",
]


def engine_limits(args: argparse.Namespace) -> list[str]:
    """The limits both engines run with, as flags both CLIs take."""
    return [f"--max-model-len={args.max_model_len}", f"--max-num-seqs={args.max_num_seqs}",
            f"--max-num-batched-tokens={args.max_num_batched_tokens}"]


def start_vllm(args: argparse.Namespace, logs: Path) -> Server:
    """vLLM's OpenAI API server on the MiniLM checkpoint with the pooling runner, eager, seed 0 (our engine's
    settings, services/engine/backends/vllm.py) and the KV bytes; no access log (the frontend writes none)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoints.resolve(MODEL)),
           "--served-model-name", MODEL, "--runner", "pooling", "--host", "127.0.0.1", "--port", str(port),
           *engine_limits(args), f"--kv-cache-memory-bytes={args.kv_cache_bytes}", "--enforce-eager", "--seed=0",
           "--disable-uvicorn-access-log"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: EngineCore in its own process
    return _spawn("vLLM", cmd, env, port, logs, "/health")


def start_fleet(args: argparse.Namespace, logs: Path) -> Server:
    """The frontend with one managed vllm engine rank (--runner pooling), the limits passed as --engine-arg."""
    port = _free_port()
    engine_args = [*engine_limits(args), f"--kv-cache-bytes={args.kv_cache_bytes}", "--runner=pooling"]
    cmd = [sys.executable, "-m", "services.frontend", "--model", MODEL, "--backend", "vllm",
           "--data-parallel-size-local", "1", "--engine-port", str(_free_port()), "--host", "127.0.0.1",
           "--port", str(port), *(f"--engine-arg={a}" for a in engine_args)]
    return _spawn("fleet", cmd, {**os.environ, "HF_HUB_OFFLINE": "1"}, port, logs, "/ready")


def check_same(servers: list[Server], args: argparse.Namespace) -> None:
    """Both list MiniLM at --max-model-len, and give the same embeddings for the same batch."""
    vectors = {}
    for s in servers:
        models = [(m["id"], m.get("max_model_len")) for m in json.loads(_get(s.base + "/v1/models"))["data"]]
        if models != [(MODEL, args.max_model_len)]:
            raise RuntimeError(f"{s.name} /v1/models: {models}, expected [({MODEL!r}, {args.max_model_len})]")
        body, _ = asyncio.run(_round(s.base, 1, 1, _body(args.batch)))
        vectors[s.name] = np.asarray([d["embedding"] for d in body[0]["data"]])
        usage = body[0]["usage"]["prompt_tokens"]
        print(f"[{s.name}] /v1/models {models}; {args.batch} inputs: {usage} prompt tokens", flush=True)
    a, b = vectors.values()
    print(f"embeddings differ by at most {np.abs(a - b).max():.2e} between the two servers", flush=True)


def _body(batch: int) -> bytes:
    inputs = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    return json.dumps({"model": MODEL, "input": inputs, "encoding_format": "float"}).encode()


async def _client(session: aiohttp.ClientSession, url: str, body: bytes, n: int, out: list[dict]) -> None:
    for _ in range(n):
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
            out.append(await resp.json())


async def _round(base: str, clients: int, per_client: int, body: bytes) -> tuple[list[dict], float]:
    done: list[dict] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(_client(session, base + "/v1/embeddings", body, per_client, done)
                               for _ in range(clients)))
        return done, time.perf_counter() - t0


@dataclass(slots=True)
class Runs:
    """One (server, concurrency)'s figures, a value per round."""

    net_us: list[float] = field(default_factory=list)
    raw_us: list[float] = field(default_factory=list)
    others_us: list[float] = field(default_factory=list)
    per_s: list[float] = field(default_factory=list)


def measure(server: Server, clients: int, args: argparse.Namespace, idle: float, runs: Runs) -> None:
    per_client = max(1, args.requests // clients)
    cpu0, others0 = cpu_s(server.api_pid), _cpu_of(server.others)
    done, wall = asyncio.run(_round(server.base, clients, per_client, _body(args.batch)))
    cpu, others1 = cpu_s(server.api_pid) - cpu0, _cpu_of(server.others)
    others = sum(others1[pid] - others0[pid] for pid in others0.keys() & others1.keys())
    n = len(done)
    if n != clients * per_client or any(len(d["data"]) != args.batch for d in done):
        raise RuntimeError(f"{server.name}: {n} answers, expected {clients * per_client} of {args.batch} each")
    runs.net_us.append(net_cpu_s(cpu, idle, wall) / n * 1e6)
    runs.raw_us.append(cpu / n * 1e6)
    runs.others_us.append(others / n * 1e6)
    runs.per_s.append(n / wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,64", help="concurrent clients per round, comma-separated")
    p.add_argument("--batch", type=int, default=16, help="inputs per request")
    p.add_argument("--requests", type=int, default=16,
                   help="requests per round, split over the clients (at least one per client)")
    p.add_argument("--repeat", type=int, default=2, help="rounds per server and concurrency")
    p.add_argument("--max-model-len", type=int, default=256, help="MiniLM's own maximum")
    p.add_argument("--kv-cache-bytes", type=int, default=16 * 2**20)
    p.add_argument("--max-num-seqs", type=int, default=256, help="our engine's default")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="our engine's default")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU measured, no load")
    p.add_argument("--start-timeout", type=float, default=600.0)
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.batch < 1 or args.repeat < 1 or args.requests < 1:
        p.error("--concurrency: positive integers; --batch, --requests, --repeat >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind through the finally: stop everything
    logs = Path(tempfile.mkdtemp(prefix="bench-pooling-"))
    servers: list[Server] = []
    try:
        for start in (start_vllm, start_fleet):
            servers.append(start(args, logs))
        for s in servers:
            wait_ready(s, args.start_timeout)
        check_same(servers, args)
        idle = find_processes_and_idle(servers, args.idle_s)
        runs = {(s.name, n): Runs() for n in levels for s in servers}
        for _ in range(args.repeat):
            for n in levels:
                for s in servers:  # interleaved: round k of vLLM, round k of the fleet, round k+1 ...
                    settle(servers)
                    measure(s, n, args, idle[s.name][0], runs[(s.name, n)])
                    r = runs[(s.name, n)]
                    print(f"[{s.name}] {n} clients: {r.per_s[-1]:.2f} requests/s", flush=True)
        report(servers, levels, runs, idle, args)
    finally:
        stop(servers)
        print(f"logs: {logs}")


def find_processes_and_idle(servers: list[Server], idle_s: float) -> dict[str, tuple[float, float]]:
    """Each server's HTTP process (measured) and the others, then the idle CPU per second of each
    server's HTTP process and of its other processes together (the engine side)."""
    for s in servers:
        pids = tree(s.proc.pid)
        s.api_pid = listener(s.port, pids)
        s.others = [pid for pid in pids if pid != s.api_pid]
        print(f"[{s.name}] HTTP server (measured): {describe(s.api_pid)}", flush=True)
        for pid in s.others:
            print(f"[{s.name}]   other process: {describe(pid)}", flush=True)
    settle(servers)
    cpu0 = {s.name: (cpu_s(s.api_pid), _cpu_of(s.others)) for s in servers}
    t0 = time.perf_counter()
    time.sleep(idle_s)
    span = time.perf_counter() - t0
    idle = {}
    for s in servers:
        api0, others0 = cpu0[s.name]
        others1 = _cpu_of(s.others)
        others = sum(others1[pid] - others0[pid] for pid in others0.keys() & others1.keys())
        idle[s.name] = ((cpu_s(s.api_pid) - api0) / span, others / span)
    return idle


def report(servers: list[Server], levels: list[int], runs: dict[tuple[str, int], Runs],
           idle: dict[str, tuple[float, float]], args: argparse.Namespace) -> None:
    med = statistics.median
    print(f"\nPOST /v1/embeddings, {args.batch} inputs a request, {args.requests} requests a round; one vLLM engine "
          f"each (CPU, {MODEL}, max-model-len {args.max_model_len}, max-num-seqs {args.max_num_seqs}, KV "
          f"{args.kv_cache_bytes} bytes); medians of {args.repeat} interleaved rounds; {os.cpu_count()} cores")
    print("idle CPU of the HTTP server process ("
          + ", ".join(f"{s.name} {idle[s.name][0] * 1e3:.1f} ms/s" for s in servers)
          + ") x each round's wall time was subtracted; raw = not subtracted; the engine side is raw (its idle: "
          + ", ".join(f"{s.name} {idle[s.name][1] * 1e3:.1f} ms/s" for s in servers) + ")\n")
    print("| clients | server | requests/s | HTTP server CPU ms/request | raw | engine side CPU ms/request |")
    print("|---|---|---|---|---|---|")
    for n in levels:
        for s in servers:
            r = runs[(s.name, n)]
            print(f"| {n} | {s.name} | {med(r.per_s):.1f} | {med(r.net_us) / 1e3:.2f} | {med(r.raw_us) / 1e3:.2f} | "
                  f"{med(r.others_us) / 1e3:.2f} |")
    print()
    for n in levels:
        for s in servers:
            r = runs[(s.name, n)]
            rounds = "/".join(f"{v:.1f}" for v in r.per_s)
            cpu = "/".join(f"{v / 1e3:.2f}" for v in r.net_us)
            print(f"{n} clients, {s.name}, per round: requests/s {rounds}; HTTP server CPU ms/request {cpu}")


if __name__ == "__main__":
    main()
