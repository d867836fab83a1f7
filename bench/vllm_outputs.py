"""The vllm backend's one pass over a step's outputs, alone: VllmBackend.step() around a fake EngineCore
(tests/support/fake_engine_core.py) that returns the same scripted decode step each time, so only our
conversion runs. Cases: N running requests with nothing asked per token, and with logprobs (k=1).
`--baseline FILE`: another version of services/engine/backends/vllm.py, measured alternately in the
same process (e.g. `git show main:services/engine/backends/vllm.py > /tmp/vllm_main.py`). Prints the
best round's CPU time per step and per output.

Run: .venv/bin/python bench/vllm_outputs.py [--requests 256] [--rounds 40] [--baseline FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.fake_engine_core import backend_with_fake_core, output, request  # noqa: E402

CASES = {"nothing asked": None, "logprobs k=1": 1}
STEPS_PER_ROUND = 50


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _prepared(module: Any, n: int, logprobs: int | None) -> Any:
    """A backend with n requests past their first token, its core replaying one decode step."""
    from vllm.v1.engine import EngineCoreOutputs

    with backend_with_fake_core(module) as backend:
        ids = [f"r{i}" for i in range(n)]
        extra = {} if logprobs is None else {"logprobs": logprobs}
        for rid in ids:
            backend.add(rid, request(rid, max_tokens=10**6, **extra))
        backend._core.script.append([output(rid, [1], first=True, logprobs=logprobs) for rid in ids])
        backend.step()
        step = {0: EngineCoreOutputs(outputs=[output(rid, [5], logprobs=logprobs) for rid in ids],
                                     timestamp=time.monotonic())}
        backend._core.step = lambda: (step, True)
        return backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--baseline", type=Path, help="another vllm.py to measure alternately with this tree's")
    args = p.parse_args()
    from services.engine.backends import vllm as current

    versions = {"this tree": current}
    if args.baseline is not None:
        versions["baseline"] = _module("services.engine.backends._baseline", args.baseline)
    backends = {(version, case): _prepared(module, args.requests, k)
                for version, module in versions.items() for case, k in CASES.items()}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for key, backend in backends.items():
            t0 = time.thread_time()  # CPU time of this thread: other processes do not move it
            for _ in range(STEPS_PER_ROUND):
                backend.step()
            best[key] = min(best.get(key, float("inf")), (time.thread_time() - t0) / STEPS_PER_ROUND)
    print(f"{args.requests} outputs per step, best of {args.rounds} rounds of {STEPS_PER_ROUND} steps (CPU time)")
    for case in CASES:
        for version in versions:
            s = best[(version, case)]
            print(f"  {case:14} {version:10} {s * 1e6:8.1f} us/step {s * 1e9 / args.requests:7.0f} ns/output")


if __name__ == "__main__":
    main()
