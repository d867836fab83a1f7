"""Frontend CPU per generated token, gRPC against HTTP token-in: N concurrent requests of the same token
ids through one frontend (a sim engine paced like a GPU: a step every --decode-ms, one token per
stream per step), as Inference.GenerateStream and as SSE on POST /inference/v1/generate (stream), and
unary Inference.Generate against the non-streamed HTTP route. The frontend's CPU time is read from
/proc before and after each round; rounds alternate between the four ways, so all see the same
machine. The load generators (grpc.aio and aiohttp) run in this process, whose CPU is not counted.
Usage: python bench/grpc_stream.py [--streams 256] [--tokens 200] [--repeat 3] [--decode-ms 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frontend_stream import _cpu_seconds, _free_port, wait_ready  # noqa: E402

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--decode-ms", type=float, default=20.0)
    args = p.parse_args()
    engine_port, http_port, grpc_port = _free_port(), _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-decode-ms", str(args.decode_ms), "--sim-decode-ms-per-seq", "0",
                               "--host", "127.0.0.1", "--port", str(engine_port), "--pub-port", str(_free_port()),
                               "--max-num-seqs", "1024"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--grpc-port", str(grpc_port),
                                 "--data-parallel-size-local", "0",
                                 "--engine-addresses", f"tcp://127.0.0.1:{engine_port}", "--log-level", "warning"],
                                cwd=ROOT)
    base, target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    ways = {"gRPC GenerateStream": lambda: _grpc_round(target, args.streams, args.tokens, True),
            "HTTP SSE generate": lambda: _http_round(base, args.streams, args.tokens, True),
            "gRPC Generate (unary)": lambda: _grpc_round(target, args.streams, args.tokens, False),
            "HTTP generate (JSON)": lambda: _http_round(base, args.streams, args.tokens, False)}
    try:
        wait_ready(base)
        for run in ways.values():  # warm: connections, first-use costs
            asyncio.run(run())
        per: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeat):
            for way, run in ways.items():
                before = _cpu_seconds(frontend.pid)
                t0 = time.perf_counter()
                tokens = asyncio.run(run())
                wall = time.perf_counter() - t0
                used = _cpu_seconds(frontend.pid) - before
                assert tokens == args.streams * args.tokens, (way, tokens)
                per[way].append(used / tokens * 1e6)
                print(f"  {way:24s} {tokens} tokens in {wall:.1f}s: {used / tokens * 1e6:.1f} us/token",
                      flush=True)
        print(f"frontend CPU per token, {args.streams} concurrent requests x {args.tokens} tokens, sim paced "
              f"{args.decode_ms:g} ms/step (median of {args.repeat}):")
        med = {w: statistics.median(v) for w, v in per.items()}
        for way, m in med.items():
            print(f"  {way:24s} {m:6.1f} us/token")
        print(f"  streamed: gRPC/HTTP x{med['gRPC GenerateStream'] / med['HTTP SSE generate']:.2f}; "
              f"unary: gRPC/HTTP x{med['gRPC Generate (unary)'] / med['HTTP generate (JSON)']:.2f}")
    finally:
        for proc in (frontend, engine):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
