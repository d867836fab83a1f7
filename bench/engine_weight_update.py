"""update_weights throughput at the engine protocol (ZMQ, raw frames): the tiny checkpoint's safetensors
file streamed into a running engine, start_weight_update to finish_weight_update, MB/s (median of runs).

The figure to compare with the frontend's gRPC UpdateWeights path (issue 13). The file is read once
before timing; each run sends every tensor (one raw frame each, --per-call tensors per call).
Usage: python bench/engine_weight_update.py [--backend vllm|sim] [--per-call 4] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import checkpoints  # noqa: E402
from checkpoints import tiny  # noqa: E402
from protocol import Ready  # noqa: E402
from tests.support.engine_client import EngineClient  # noqa: E402
from tests.support.procs import start_engine  # noqa: E402
from tests.support.safetensors_frames import weight_calls  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("vllm", "sim"), default="vllm")
    p.add_argument("--per-call", type=int, default=4, help="tensors per update_weights call")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    weights = checkpoints.resolve("tiny", weights=True) / tiny.WEIGHTS_FILE
    calls = weight_calls(weights, a.per_call)
    nbytes = sum(len(f) for _, frames in calls for f in frames)
    with tempfile.TemporaryDirectory() as tmp:
        engine = start_engine(Path(tmp), "--model", "tiny", "--backend", a.backend, "--max-model-len", "512")
        client = EngineClient(engine.endpoint())
        try:
            assert isinstance(client.handshake(timeout_s=60), Ready)
            rates = []
            for run in range(a.runs):
                t0 = time.perf_counter()
                assert client.utility("start_weight_update").ok
                for args, frames in calls:
                    r = client.utility("update_weights", frames=frames, timeout_s=120, **args)
                    assert r.ok, r.error
                r = client.utility("finish_weight_update", version=f"bench-{run}", timeout_s=60)
                assert r.ok, r.error
                elapsed = time.perf_counter() - t0
                rates.append(nbytes / elapsed / 1e6)
                print(f"run {run + 1}: {nbytes / 1e6:.1f} MB in {elapsed * 1000:.0f} ms = {rates[-1]:.0f} MB/s")
        finally:
            client.close()
            engine.stop()
    print(f"{a.backend} backend, {len(calls)} update_weights call(s) of {a.per_call} tensor(s), "
          f"{nbytes / 1e6:.1f} MB: median {statistics.median(rates):.0f} MB/s over {a.runs} runs")


if __name__ == "__main__":
    main()
