"""Weight-update throughput, the tiny checkpoint's safetensors file streamed into a running engine from
start to finish (MB/s, median of runs), two ways side by side against one engine: gRPC
(RlControl.StartWeightUpdate, UpdateWeights' client stream of tensors, FinishWeightUpdate, through a
frontend with --grpc-port, which sends them on in batches as raw ZMQ frames) and the engine protocol
directly (update_weights utility calls, --per-call tensors each, one raw frame per tensor). Runs
alternate between the two. The file is read once before timing.
Usage: python bench/weight_update.py [--backend vllm|sim] [--per-call 4] [--runs 3]
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

import grpc  # noqa: E402

import checkpoints  # noqa: E402
from checkpoints import tiny  # noqa: E402
from protocol import Ready  # noqa: E402
from protocol.grpc import pb2, pb2_grpc, tensor_messages  # noqa: E402
from tests.support.engine_client import EngineClient  # noqa: E402
from tests.support.procs import free_port_block, start_engine, start_frontend  # noqa: E402
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
    count = sum(len(args["tensors"]) for args, _ in calls)
    rates: dict[str, list[float]] = {"gRPC UpdateWeights": [], "engine protocol": []}
    with tempfile.TemporaryDirectory() as tmp:
        engine = start_engine(Path(tmp), "--model", "tiny", "--backend", a.backend, "--max-model-len", "512")
        grpc_port = free_port_block(1)
        frontend = start_frontend(Path(tmp), "--data-parallel-size-local", "0", "--engine-addresses",
                                  engine.endpoint(), "--grpc-port", str(grpc_port))
        client = EngineClient(engine.endpoint())
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        rl = pb2_grpc.RlControlStub(channel)
        try:
            # A tensor over the server's message limit (--max-body-bytes) goes in pieces (Tensor.more).
            limit = pb2_grpc.ControlStub(channel).GetServerInfo(pb2.GetServerInfoRequest(), timeout=60)
            messages = [m for args, frames in calls for t, frame in zip(args["tensors"], frames, strict=True)
                        for m in tensor_messages(t["name"], t["dtype"], t["shape"], frame, limit.max_message_bytes)]
            assert isinstance(client.handshake(timeout_s=60), Ready)
            for run in range(a.runs):
                for way in rates:
                    t0 = time.perf_counter()
                    if way == "engine protocol":
                        assert client.utility("start_weight_update").ok
                        for args, frames in calls:
                            r = client.utility("update_weights", frames=frames, timeout_s=120, **args)
                            assert r.ok, r.error
                        r = client.utility("finish_weight_update", version=f"bench-{run}", timeout_s=60)
                        assert r.ok, r.error
                    else:
                        rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), timeout=60)
                        sent = rl.UpdateWeights(iter(messages), timeout=120)
                        assert sent.bytes == nbytes, sent
                        rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version=f"grpc-{run}"), timeout=60)
                    elapsed = time.perf_counter() - t0
                    rates[way].append(nbytes / elapsed / 1e6)
                    print(f"run {run + 1} {way}: {nbytes / 1e6:.1f} MB in {elapsed * 1000:.0f} ms = "
                          f"{rates[way][-1]:.0f} MB/s", flush=True)
        finally:
            channel.close()
            client.close()
            frontend.stop()
            engine.stop()
    print(f"{a.backend} backend, tiny checkpoint ({count} tensors, {nbytes / 1e6:.1f} MB), start to finish, "
          f"median of {a.runs}:")
    for way, r in rates.items():
        how = "(all tensors in one client stream)" if way.startswith("gRPC") else f"({a.per_call} tensors per call)"
        print(f"  {way:20s} {statistics.median(r):5.0f} MB/s {how}")


if __name__ == "__main__":
    main()
