"""Weight-update throughput, the tiny checkpoint's safetensors file streamed into a running engine from
start to finish (MB/s, median of runs), two ways side by side against one engine: gRPC
(RlControl.StartWeightUpdate, UpdateWeights' client stream of tensors, FinishWeightUpdate, through a
frontend with --grpc-port, which sends them on in batches as raw ZMQ frames) and the engine protocol
directly (update_weights utility calls, --per-call tensors each, one raw frame per tensor). With
--before REV, REV's frontend (a /tmp worktree, this venv) serves gRPC too, over the same engine. Runs
alternate between the ways. The file is read once before timing.
Usage: python bench/weight_update.py [--backend vllm|sim] [--per-call 4] [--runs 3] [--before REV]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from frontend_stream import _cpu_seconds, tree_at  # noqa: E402  (bench/, this script's directory)

import checkpoints  # noqa: E402
from checkpoints import tiny  # noqa: E402
from protocol import Ready  # noqa: E402
from protocol.grpc import pb2, pb2_grpc, tensor_messages  # noqa: E402
from tests.support.engine_client import EngineClient  # noqa: E402
from tests.support.procs import FrontendProc, free_port_block, start_engine, start_frontend  # noqa: E402
from tests.support.safetensors_frames import weight_calls  # noqa: E402


def _old_frontend(tmp: Path, tree: Path, engine: str, grpc_port: int) -> FrontendProc:
    """The frontend of another tree (a worktree of REV) over the same engine, run with this venv."""
    port = free_port_block(1, spread=0)
    log_path = tmp / f"frontend-before-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(port), "--data-parallel-size-local", "0", "--engine-addresses",
                                 engine, "--grpc-port", str(grpc_port)], cwd=tree, stdout=log,
                                stderr=subprocess.STDOUT)
    frontend = FrontendProc(proc, port, log_path)
    try:
        frontend.wait_ready()
    except BaseException:
        frontend.stop()
        raise
    return frontend


def _grpc_update(rl: Any, messages: list[Any], nbytes: int, version: str) -> None:
    rl.StartWeightUpdate(pb2.StartWeightUpdateRequest(), timeout=60)
    sent = rl.UpdateWeights(iter(messages), timeout=120)
    assert sent.bytes == nbytes, sent
    rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version=version), timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("vllm", "sim"), default="vllm")
    p.add_argument("--per-call", type=int, default=4, help="tensors per update_weights call")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--before", default=None, metavar="REV",
                   help="also stream the update through REV's frontend (a worktree), runs alternating")
    a = p.parse_args()
    weights = checkpoints.resolve("tiny", weights=True) / tiny.WEIGHTS_FILE
    calls = weight_calls(weights, a.per_call)
    nbytes = sum(len(f) for _, frames in calls for f in frames)
    count = sum(len(args["tensors"]) for args, _ in calls)
    grpc_ways = ["gRPC UpdateWeights"] + ([f"gRPC before ({a.before})"] if a.before else [])
    rates: dict[str, list[float]] = {way: [] for way in [*grpc_ways, "engine protocol"]}
    cpu: dict[str, list[float]] = {way: [] for way in grpc_ways}  # the frontend's CPU ms per MB
    with tempfile.TemporaryDirectory() as tmp:
        engine = start_engine(Path(tmp), "--model", "tiny", "--backend", a.backend, "--max-model-len", "512")
        frontends: list[FrontendProc] = []
        channels: list[grpc.Channel] = []
        client = EngineClient(engine.endpoint())
        try:
            stubs: dict[str, Any] = {}
            pids: dict[str, int] = {}
            for way in grpc_ways:
                grpc_port = free_port_block(1)
                if way == grpc_ways[0]:
                    frontends.append(start_frontend(Path(tmp), "--data-parallel-size-local", "0",
                                                    "--engine-addresses", engine.endpoint(),
                                                    "--grpc-port", str(grpc_port)))
                else:
                    frontends.append(_old_frontend(Path(tmp), tree_at(a.before), engine.endpoint(), grpc_port))
                pids[way] = frontends[-1].proc.pid
                channels.append(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
                stubs[way] = pb2_grpc.RlControlStub(channels[-1])
            # A tensor over the server's message limit (--max-body-bytes) goes in pieces (Tensor.more).
            limit = pb2_grpc.ControlStub(channels[0]).GetServerInfo(pb2.GetServerInfoRequest(), timeout=60)
            messages = [m for args, frames in calls for t, frame in zip(args["tensors"], frames, strict=True)
                        for m in tensor_messages(t["name"], t["dtype"], t["shape"], frame, limit.max_message_bytes)]
            assert isinstance(client.handshake(timeout_s=60), Ready)
            for run in range(a.runs):
                for way in rates:
                    t0 = time.perf_counter()
                    used = _cpu_seconds(pids[way]) if way in pids else 0.0
                    if way == "engine protocol":
                        assert client.utility("start_weight_update").ok
                        for args, frames in calls:
                            r = client.utility("update_weights", frames=frames, timeout_s=120, **args)
                            assert r.ok, r.error
                        r = client.utility("finish_weight_update", version=f"bench-{run}", timeout_s=60)
                        assert r.ok, r.error
                    else:
                        _grpc_update(stubs[way], messages, nbytes, f"grpc-{run}")
                    elapsed = time.perf_counter() - t0
                    rates[way].append(nbytes / elapsed / 1e6)
                    spent = ""
                    if way in pids:
                        cpu[way].append((_cpu_seconds(pids[way]) - used) * 1e3 / (nbytes / 1e6))
                        spent = f", frontend CPU {cpu[way][-1]:.2f} ms/MB"
                    print(f"run {run + 1} {way}: {nbytes / 1e6:.1f} MB in {elapsed * 1000:.0f} ms = "
                          f"{rates[way][-1]:.0f} MB/s{spent}", flush=True)
        finally:
            for channel in channels:
                channel.close()
            client.close()
            for frontend in frontends:
                frontend.stop()
            engine.stop()
    print(f"{a.backend} backend, tiny checkpoint ({count} tensors, {nbytes / 1e6:.1f} MB), start to finish, "
          f"median of {a.runs}:")
    for way, r in rates.items():
        how = "(all tensors in one client stream)" if way.startswith("gRPC") else f"({a.per_call} tensors per call)"
        spent = f", frontend CPU {statistics.median(cpu[way]):.2f} ms/MB" if way in cpu else ""
        print(f"  {way:24s} {statistics.median(r):5.0f} MB/s {how}{spent}")
    if a.before:
        now, before = (statistics.median(rates[w]) for w in grpc_ways)
        cpu_now, cpu_before = (statistics.median(cpu[w]) for w in grpc_ways)
        print(f"  gRPC now / before: throughput x{now / before:.2f}, frontend CPU per MB x{cpu_now / cpu_before:.2f}")


if __name__ == "__main__":
    main()
