"""Engine start time: process launch to an accepted handshake (Ready), per backend, tiny model.

The tiny checkpoint is built before timing (first-use cost is separate and printed). vLLM's first
start on a fresh machine also compiles CPU kernels into its cache, so run 1 may be slower.
Usage: python bench/engine_start.py [--backends vllm,sim] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import checkpoints  # noqa: E402
from protocol import Ready, decode, encode, make_hello  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_start(backend: str, timeout_s: float = 300.0) -> float:
    port = _free_port()
    cmd = [sys.executable, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", backend,
           "--host", "127.0.0.1", "--port", str(port), "--pub-port", str(_free_port())]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send_multipart(encode(make_hello("bench")))
        if not sock.poll(timeout_s * 1000):
            raise TimeoutError(f"{backend} engine not ready in {timeout_s}s")
        msg = decode(sock.recv_multipart(), any_major=True)
        elapsed = time.perf_counter() - t0
        assert isinstance(msg, Ready), msg
        return elapsed
    finally:
        sock.close()
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", default="vllm,sim")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    t0 = time.perf_counter()
    checkpoints.resolve("tiny", weights=True)
    print(f"tiny checkpoint ready (built or cached) in {time.perf_counter() - t0:.2f}s")
    for backend in args.backends.split(","):
        runs = [time_start(backend) for _ in range(args.runs)]
        print(f"{backend:>5}: start to Ready median {statistics.median(runs):.2f}s "
              f"(runs: {', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
