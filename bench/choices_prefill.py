"""Prompt tokens the engines compute for one request with n=4 vs 4 separate requests of the same prompt.

Starts a headless engine (R ranks, sim paced like a GPU or the real vllm backend with the tiny model) and a
frontend over it. Each trial takes a fresh prompt (no earlier trial's blocks to hit) and either sends one
completion with n=4, or sends 4 one-choice completions of it at once (as 4 clients would), or one after
another; the engines' prefix-cache counters on the frontend's /metrics (tokens looked up minus tokens
found) give the prompt tokens they computed. With n=4 the choices share the prompt's rank and the
later ones hit the blocks the first one scheduled; separate requests sent at once are placed before
any of them has published its blocks, so they spread over the ranks and compute the prompt on each.
Usage: python bench/choices_prefill.py [--backend sim|vllm] [--ranks 2] [--prompt-words 400] [--trials 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from frontend_stream import _free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _counters(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics").text
    queries = sum(float(v) for v in re.findall(r"^vllm:prefix_cache_queries_total\{.*\} (\S+)$", text, re.M))
    hits = sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{.*\} (\S+)$", text, re.M))
    return queries, hits


def _computed(base: str, before: tuple[float, float], looked_up: int) -> int:
    """Prompt tokens computed since `before`, once the engines' Stats report all `looked_up` lookups."""
    deadline = time.monotonic() + 10
    while True:
        queries, hits = _counters(base)
        if queries - before[0] >= looked_up or time.monotonic() > deadline:
            return int((queries - before[0]) - (hits - before[1]))
        time.sleep(0.05)


async def _trial(base: str, mode: str, words: int, rng: random.Random) -> tuple[int, int]:
    prompt = " ".join(rng.choice(WORDS) for _ in range(words))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "seed": rng.randrange(1 << 30)}
    before = _counters(base)
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        if mode == "n=4":
            r = await client.post("/v1/completions", json={**body, "n": 4})
            prompt_tokens = r.json()["usage"]["prompt_tokens"]
        elif mode == "4 at once":
            rs = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(4)))
            prompt_tokens = rs[0].json()["usage"]["prompt_tokens"]
        else:
            for _ in range(4):
                r = await client.post("/v1/completions", json=body)
            prompt_tokens = r.json()["usage"]["prompt_tokens"]
    return prompt_tokens, _computed(base, before, 4 * prompt_tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--prompt-words", type=int, default=400)
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    py = sys.executable
    engine_port = _free_port()
    backend = ["--backend", "sim", "--sim-decode-ms", "20"] if args.backend == "sim" else ["--backend", "vllm"]
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", *backend,
                               "--host", "127.0.0.1", "--port", str(engine_port),
                               "--data-parallel-size-local", str(args.ranks)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = _free_port()
    addresses = ",".join(f"tcp://127.0.0.1:{engine_port + i}" for i in range(args.ranks))
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(port), "--data-parallel-size", str(args.ranks),
                                 "--data-parallel-size-local", "0", "--engine-addresses", addresses,
                                 "--log-level", "warning"], cwd=ROOT, env={**os.environ})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, timeout_s=600)
        rng = random.Random(0)
        modes = ("n=4", "4 at once", "4 in turn")
        computed: dict[str, list[int]] = {m: [] for m in modes}
        prompt_lens: list[int] = []
        for _ in range(args.trials):
            for mode in modes:  # side by side: each trial runs every mode, on prompts of one length
                prompt_len, tokens = asyncio.run(_trial(base, mode, args.prompt_words, rng))
                prompt_lens.append(prompt_len)
                computed[mode].append(tokens)
        prompt_len = int(statistics.median(prompt_lens))
        print(f"backend {args.backend}, {args.ranks} ranks, prompts of ~{prompt_len} tokens, "
              f"{args.trials} trials (medians)")
        for mode in modes:
            tokens = statistics.median(computed[mode])
            print(f"  {mode:>10}: {tokens:7.0f} prompt tokens computed ({tokens / prompt_len:.2f} x the prompt)")
        ratio = statistics.median(computed["4 at once"]) / max(1.0, statistics.median(computed["n=4"]))
        print(f"  4 at once / n=4: x{ratio:.2f}")
    finally:
        frontend.terminate()
        engine.terminate()
        frontend.wait(30)
        engine.wait(30)


if __name__ == "__main__":
    main()
