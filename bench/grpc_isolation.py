"""One stream's inter-token gaps over gRPC while the same frontend receives the largest Generate requests
--max-body-bytes allows (1.3M token ids, 3.9 MB): they are parsed and checked in a translation worker
process, so the stream's tokens keep their pace (a sim engine stepping every --decode-ms). Prints the
median and the largest gap, with the large requests and without (a run of the stream alone first).
Usage: python bench/grpc_isolation.py [--decode-ms 10] [--big 5]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frontend_stream import _free_port, wait_ready  # noqa: E402

from protocol.grpc import pb2, pb2_grpc  # noqa: E402


async def _run(target: str, big: int) -> list[float]:
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", 1 << 30)]) as channel:
        stub = pb2_grpc.InferenceStub(channel)
        large = pb2.GenerateRequest(token_ids=[100_000] * 1_300_000, sampling_params=pb2.SamplingParams(max_tokens=1))

        async def stream() -> list[float]:
            gaps: list[float] = []
            last = None
            req = pb2.GenerateRequest(token_ids=[1, 2, 3], sampling_params=pb2.SamplingParams(max_tokens=300,
                                                                                            ignore_eos=True))
            async for _ in stub.GenerateStream(req):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
            return gaps

        async def large_ones() -> None:
            await asyncio.sleep(0.5)
            for _ in range(big):
                try:  # refused past the context length, after the worker parsed and checked it
                    await stub.Generate(large)
                except grpc.RpcError:
                    pass
                await asyncio.sleep(0.1)

        gaps, _ = await asyncio.gather(stream(), large_ones())
        return gaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decode-ms", type=float, default=10.0)
    p.add_argument("--big", type=int, default=5, help="large requests sent during the stream")
    args = p.parse_args()
    engine_port, http_port, grpc_port = _free_port(), _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--sim-decode-ms", str(args.decode_ms), "--host", "127.0.0.1", "--port",
                               str(engine_port), "--pub-port", str(_free_port())], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--grpc-port", str(grpc_port),
                                 "--data-parallel-size-local", "0", "--engine-addresses",
                                 f"tcp://127.0.0.1:{engine_port}", "--log-level", "warning"], cwd=ROOT)
    try:
        wait_ready(f"http://127.0.0.1:{http_port}")
        target = f"127.0.0.1:{grpc_port}"
        for label, big in (("alone", 0), (f"with {args.big} requests of 3.9 MB", args.big)):
            gaps = asyncio.run(_run(target, big))
            print(f"GenerateStream gaps {label:28s} median {statistics.median(gaps) * 1e3:5.1f} ms, "
                  f"max {max(gaps) * 1e3:6.1f} ms (steps every {args.decode_ms:g} ms)", flush=True)
    finally:
        for proc in (frontend, engine):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
