"""Step rate of the sim backend at 256 running sequences (instant mode: pure scheduler cost).

Run: .venv/bin/python bench/sim_steps.py [--seqs 256] [--prompt 200] [--steps 2000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# Runnable as a plain script from a checkout that is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol import GenerateRequest, SamplingParams
from services.engine.backends.sim import SimBackend, SimConfig


def build(seqs: int, prompt_len: int) -> SimBackend:
    config = SimConfig(instant=True, max_num_seqs=seqs, num_kv_blocks=65536, max_model_len=65536)
    backend = SimBackend(config, model="bench", vocab_size=32000, eos_token_id=2)
    params = SamplingParams(max_tokens=1_000_000, ignore_eos=True)
    for i in range(seqs):
        prompt = [(i * 7919 + j * 31) % 32000 for j in range(prompt_len)]
        backend.add(f"r{i}", GenerateRequest(f"r{i}", prompt, params, 0.0))
    # Prefill everything so every timed step is a pure decode step over the full batch.
    while len(backend.step().outputs) < seqs:
        pass
    return backend


def run(seqs: int, prompt_len: int, steps: int) -> float:
    backend = build(seqs, prompt_len)
    assert backend.load().running == seqs, backend.load()
    start = time.perf_counter()
    for _ in range(steps):
        result = backend.step()
    elapsed = time.perf_counter() - start
    assert len(result.outputs) == seqs
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rates = [run(args.seqs, args.prompt, args.steps) for _ in range(args.repeats)]
    median = statistics.median(rates)
    print(
        f"sim steps/s at {args.seqs} running: median {median:,.0f} "
        f"(min {min(rates):,.0f}, max {max(rates):,.0f}, {args.repeats} x {args.steps} steps); "
        f"{1e6 / median:,.1f} us/step, {1e6 / median / args.seqs:,.2f} us/seq/step"
    )


if __name__ == "__main__":
    main()
