"""What large gRPC messages cost the frontend's memory: rounds of 4 concurrent 200 MB Generate calls,
first without an API key, then with one, against a frontend with --api-key and --grpc-port (one sim
engine). Prints each round's answer and the frontend process's RSS after it (and its growth since the
start). `--code DIR` runs the frontend from another checkout (the main branch, for a before and after).
Usage: python bench/grpc_memory.py [--rounds 4] [--calls 4] [--mb 200] [--code /work/main]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frontend_stream import _free_port, wait_ready  # noqa: E402

from protocol.grpc import pb2  # noqa: E402

KEY = "bench-key"


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _call(target: str, payload: bytes, metadata: tuple[tuple[str, str], ...]) -> str:
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as channel:
        generate = channel.unary_unary("/fleet.v1.Inference/Generate")  # the request sent as bytes, as built
        try:
            generate(payload, metadata=metadata, timeout=120)
            return "OK"
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()[:70]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4, help="rounds of each kind (without a key, with one)")
    p.add_argument("--calls", type=int, default=4, help="concurrent calls per round")
    p.add_argument("--mb", type=int, default=200, help="each call's message size, MB")
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose frontend runs")
    args = p.parse_args()
    code = args.code.resolve()
    env = {**os.environ, "PYTHONPATH": str(code)}
    engine_port, http_port, grpc_port = _free_port(), _free_port(), _free_port()
    py = sys.executable
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               "--host", "127.0.0.1", "--port", str(engine_port), "--pub-port", str(_free_port())],
                              cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--grpc-port", str(grpc_port), "--api-key", KEY,
                                 "--data-parallel-size-local", "0", "--engine-addresses",
                                 f"tcp://127.0.0.1:{engine_port}", "--log-level", "warning"], cwd=code, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{http_port}")
        target = f"127.0.0.1:{grpc_port}"
        # A GenerateRequest of --mb MB (its cache_salt), serialized once.
        payload = pb2.GenerateRequest(token_ids=[1, 2, 3], cache_salt="s" * (args.mb * 1_000_000)).SerializeToString()
        start = _rss_mb(frontend.pid)
        print(f"frontend from {code}: RSS {start:.0f} MB at the start; {args.calls} concurrent calls of "
              f"{len(payload) / 1e6:.0f} MB per round", flush=True)
        for label, metadata in (("no API key", ()), ("API key", (("authorization", f"Bearer {KEY}"),))):
            for i in range(args.rounds):
                t0 = time.perf_counter()
                with ThreadPoolExecutor(args.calls) as pool:
                    answers = list(pool.map(_call, [target] * args.calls, [payload] * args.calls,
                                            [metadata] * args.calls))
                rss = _rss_mb(frontend.pid)
                print(f"{label:10s} round {i + 1}: {time.perf_counter() - t0:5.1f} s, RSS {rss:6.0f} MB "
                      f"(+{rss - start:5.0f} MB); {answers[0]}", flush=True)
    finally:
        for proc in (frontend, engine):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
