"""Frontend CPU per generated token, gRPC against HTTP token-in: N concurrent requests of the same token
ids through one frontend (a sim engine paced like a GPU: a step every --decode-ms, one token per
stream per step), as Inference.GenerateStream and as SSE on POST /inference/v1/generate (stream), and
unary Inference.Generate against the non-streamed HTTP route. The frontend's CPU time is read from
/proc before and after each round; rounds alternate between the four ways (and, with --before REV,
between this tree's frontend and REV's, each over its own engine), so all see the same machine. The
load generators (grpc.aio and aiohttp) run in this process, whose CPU is not counted.
Usage: python bench/grpc_stream.py [--streams 256] [--tokens 200] [--repeat 3] [--decode-ms 20] [--before REV]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frontend_stream import _cpu_seconds, _free_port, tree_at, wait_ready  # noqa: E402

from protocol.grpc import pb2, pb2_grpc  # noqa: E402

PROMPT = list(range(1000, 1032))


async def _http_round(base: str, streams: int, tokens: int, stream: bool) -> int:
    body = json.dumps({"token_ids": PROMPT, "stream": stream,
                       "stream_options": {"include_usage": True} if stream else None,
                       "sampling_params": {"max_tokens": tokens, "ignore_eos": True}}).encode()

    async def one(session: aiohttp.ClientSession) -> int:
        async with session.post(base + "/inference/v1/generate", data=body,
                                headers={"content-type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            if not stream:
                return len((await resp.json())["choices"][0]["token_ids"])
            n = 0
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"token_ids":[' in line:
                    n += len(json.loads(line[6:])["choices"][0]["token_ids"])
            return n

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        return sum(await asyncio.gather(*(one(session) for _ in range(streams))))


async def _grpc_round(target: str, streams: int, tokens: int, stream: bool) -> int:
    req = pb2.GenerateRequest(token_ids=PROMPT, sampling_params=pb2.SamplingParams(max_tokens=tokens,
                                                                                  ignore_eos=True))
    # Several channels (HTTP/2 connections), as many clients would open; one carries at most ~100 streams.
    channels = [grpc.aio.insecure_channel(target) for _ in range(max(1, streams // 64))]
    stubs = [pb2_grpc.InferenceStub(c) for c in channels]

    async def one(i: int) -> int:
        stub = stubs[i % len(stubs)]
        if not stream:
            return len((await stub.Generate(req, timeout=600)).token_ids)
        n = 0
        async for resp in stub.GenerateStream(req, timeout=600):
            n += len(resp.token_ids)
        return n

    try:
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))
    finally:
        for c in channels:
            await c.close()


def _start(tree: Path, decode_ms: float) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str, str]:
    """A sim engine paced at decode_ms and a frontend (the one in `tree`) over it, serving HTTP and gRPC."""
    engine_port, http_port, grpc_port = _free_port(), _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-decode-ms", str(decode_ms), "--sim-decode-ms-per-seq", "0",
                               "--host", "127.0.0.1", "--port", str(engine_port), "--pub-port", str(_free_port()),
                               "--max-num-seqs", "1024"], cwd=tree, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--grpc-port", str(grpc_port),
                                 "--data-parallel-size-local", "0",
                                 "--engine-addresses", f"tcp://127.0.0.1:{engine_port}", "--log-level", "warning"],
                                cwd=tree)
    return engine, frontend, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"


WAYS = ("gRPC GenerateStream", "HTTP SSE generate", "gRPC Generate (unary)", "HTTP generate (JSON)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--decode-ms", type=float, default=20.0)
    p.add_argument("--before", default=None, metavar="REV",
                   help="also run the frontend of this git revision (a worktree), rounds alternating with this one")
    args = p.parse_args()
    trees = {"now": ROOT, **({f"before ({args.before})": tree_at(args.before)} if args.before else {})}
    procs = {name: _start(tree, args.decode_ms) for name, tree in trees.items()}

    def rounds(base: str, target: str) -> dict[str, Callable[[], Coroutine[Any, Any, int]]]:
        return {WAYS[0]: lambda: _grpc_round(target, args.streams, args.tokens, True),
                WAYS[1]: lambda: _http_round(base, args.streams, args.tokens, True),
                WAYS[2]: lambda: _grpc_round(target, args.streams, args.tokens, False),
                WAYS[3]: lambda: _http_round(base, args.streams, args.tokens, False)}

    try:
        for _, _, base, _ in procs.values():
            wait_ready(base)
        ways = {name: rounds(base, target) for name, (_, _, base, target) in procs.items()}
        for runs in ways.values():  # warm: connections, first-use costs
            for run in runs.values():
                asyncio.run(run())
        per: dict[tuple[str, str], list[float]] = {(t, w): [] for t in trees for w in WAYS}
        for _ in range(args.repeat):
            for way in WAYS:  # every way's rounds side by side, each tree in turn: all see the same machine
                for tree in trees:
                    frontend = procs[tree][1]
                    before = _cpu_seconds(frontend.pid)
                    t0 = time.perf_counter()
                    tokens = asyncio.run(ways[tree][way]())
                    wall = time.perf_counter() - t0
                    used = _cpu_seconds(frontend.pid) - before
                    assert tokens == args.streams * args.tokens, (tree, way, tokens)
                    per[(tree, way)].append(used / tokens * 1e6)
                    print(f"  {tree:12s} {way:24s} {tokens} tokens in {wall:.1f}s: {used / tokens * 1e6:.1f} us/token",
                          flush=True)
        print(f"frontend CPU per token, {args.streams} concurrent requests x {args.tokens} tokens, sim paced "
              f"{args.decode_ms:g} ms/step (median of {args.repeat}, us/token):")
        med = {k: statistics.median(v) for k, v in per.items()}
        print(f"  {'':24s} " + " ".join(f"{t:>20s}" for t in trees))
        for way in WAYS:
            print(f"  {way:24s} " + " ".join(f"{med[(t, way)]:20.1f}" for t in trees))
        for t in trees:
            print(f"  {t}: streamed gRPC/HTTP x{med[(t, WAYS[0])] / med[(t, WAYS[1])]:.2f}; "
                  f"unary gRPC/HTTP x{med[(t, WAYS[2])] / med[(t, WAYS[3])]:.2f}")
    finally:
        for engine, frontend, _, _ in procs.values():
            for proc in (frontend, engine):
                proc.terminate()
        for engine, frontend, _, _ in procs.values():
            for proc in (frontend, engine):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    main()
