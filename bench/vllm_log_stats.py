"""What vLLM's log_stats (its request events, which protocol 1.4's timings are made of) costs the vllm
backend's step loop: the same batch, on the tiny model on CPU, with log_stats off and on, each setting in
its own process, alternated. Prints per step (medians over steps) the whole backend step (wall time), vLLM's
scheduler bookkeeping (schedule + update_from_output, where log_stats acts: events, make_stats) and our
conversion of the outputs (CPU time of the engine thread, which other processes do not move), and
make_stats' own cost per call.

Run: .venv/bin/python bench/vllm_log_stats.py [--requests 64] [--prompt 64] [--tokens 32] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _timed(obj: Any, name: str, into: list[float]) -> None:
    """Wrap obj.name so each call's CPU seconds on this thread are added to into[0]: thread time, not wall
    time, so that other processes on a shared machine do not move the figure."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            into[0] += time.thread_time() - t0

    setattr(obj, name, wrapper)


def worker(log_stats: bool, requests: int, prompt_len: int, tokens: int, rounds: int) -> dict[str, Any]:
    from timing import per_call_us

    import checkpoints
    from protocol import GenerateRequest, SamplingParams
    from services.engine.backends.vllm import VllmBackend
    from services.engine.config import EngineConfig

    config = EngineConfig(model="tiny", backend="vllm", max_model_len=1024, kv_cache_bytes=32 * 2**20)
    backend = VllmBackend(config, checkpoints.resolve("tiny", weights=True), log_stats=log_stats)
    core_s, sched_s = [0.0], [0.0]
    _timed(backend._core, "step", core_s)
    _timed(backend._core.scheduler, "schedule", sched_s)
    _timed(backend._core.scheduler, "update_from_output", sched_s)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    per_round = []
    timed = 0
    for r in range(rounds + 1):  # round 0 warms up
        for i in range(requests):
            prompt = [(r * 104729 + i * 7919 + j * 31) % 30000 + 100 for j in range(prompt_len)]
            backend.add(f"{r}-{i}", GenerateRequest(f"{r}-{i}", prompt, params, time.time()))
        steps: list[tuple[float, float, float]] = []  # per step: whole (wall), scheduler and ours (CPU)
        make_stats_us = 0.0
        while backend.has_work():
            core_s[0] = sched_s[0] = 0.0
            t0, c0 = time.perf_counter(), time.thread_time()
            result = backend.step()
            took, cpu = time.perf_counter() - t0, time.thread_time() - c0
            steps.append((took, sched_s[0], cpu - core_s[0]))
            timed += sum(1 for o in result.outputs if o.timings is not None)
            if len(steps) == 4 and log_stats:  # mid-batch, every request running: make_stats on its own
                make_stats_us = per_call_us(backend._core.scheduler.make_stats, 1000, 5)
        if r:  # medians over steps: a step another process's burst slowed down does not move them
            per_round.append({"step_ms": statistics.median(s[0] for s in steps) * 1e3,
                              "sched_us": statistics.median(s[1] for s in steps) * 1e6,
                              "ours_us": statistics.median(s[2] for s in steps) * 1e6, "steps": len(steps),
                              "make_stats_us": make_stats_us})
    backend.shutdown()
    return {key: statistics.median(p[key] for p in per_round) for key in per_round[0]} | {"timed": timed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per process")
    parser.add_argument("--runs", type=int, default=3, help="processes per setting, alternated")
    parser.add_argument("--worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker == "on", args.requests, args.prompt, args.tokens, args.rounds)))
        return
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(args.runs):
        for setting in ("off", "on"):
            cmd = [sys.executable, __file__, "--worker", setting, "--requests", str(args.requests),
                   "--prompt", str(args.prompt), "--tokens", str(args.tokens), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
            results[setting].append(json.loads(out.strip().splitlines()[-1]))
    print(f"vllm backend, tiny model on CPU, {args.requests} requests x ({args.prompt} prompt + {args.tokens} "
          f"generated), medians of {args.runs} processes x {args.rounds} batches:")
    for setting, runs in results.items():
        keys = ("step_ms", "sched_us", "ours_us", "steps", "make_stats_us")
        med = {key: statistics.median(r[key] for r in runs) for key in keys}
        print(f"  log_stats={setting:<3}  step {med['step_ms']:.3f} ms (wall)  vLLM scheduler {med['sched_us']:.1f} us "
              f"(CPU)  our conversion {med['ours_us']:.1f} us (CPU)  ({med['steps']:.0f} steps/batch; outputs with "
              f"timings {runs[0]['timed']})" + (f"; make_stats alone {med['make_stats_us']:.1f} us" if setting == "on"
                                                 else ""))


if __name__ == "__main__":
    main()
