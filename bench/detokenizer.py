"""Per-token cost of streaming text: IncrementalDetokenizer.push and StopChecker.push, next to
tokenizers' DecodeStream and the naive way (re-decode / re-scan everything each step).

Run: .venv/bin/python bench/detokenizer.py [--tokens 3000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Runnable as a plain script from a checkout that is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

import checkpoints
from services.frontend.text.detokenizer import IncrementalDetokenizer, warm_up
from services.frontend.text.stop_strings import StopChecker

PARAGRAPHS = (
    "Serving large language models means streaming text one token at a time to many clients. ",
    "我们今天讨论大型语言模型的推理服务，以及流式输出的性能与正确性。",
    "Stop strings like </answer> must never leak, even when split across tokens: <ans, </a. ",
    "龘龖鬱麤靐这些生僻字会被拆成多个字节级别的词元。\n\n",
)
STOPS = ["</answer>x", "\n\nUser:"]  # never complete in the text, so every push is searched
PROMPT = "<|im_start|>user\nWrite about serving.<|im_end|>\n<|im_start|>assistant\n"


def generated_ids(tokenizer: Tokenizer, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        ids += tokenizer.encode("".join(PARAGRAPHS), add_special_tokens=False).ids
    return ids[:count]


def ours(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> float:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    push = detok.push
    singles = [[i] for i in ids]  # the engine hands a list per step; build them outside the clock
    start = time.perf_counter()
    for step in singles:
        push(step)
    detok.flush()
    return time.perf_counter() - start


def decode_stream(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> float:
    stream = DecodeStream(ids=prompt[-6:], skip_special_tokens=True)
    step = stream.step
    start = time.perf_counter()
    for tid in ids:
        step(tokenizer, tid)
    return time.perf_counter() - start


def naive_detok(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> float:
    start = time.perf_counter()
    emitted = 0
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            text[emitted:]
            emitted = len(text)
    return time.perf_counter() - start


def stop_checker(deltas: list[str]) -> float:
    checker = StopChecker(STOPS)
    push = checker.push
    start = time.perf_counter()
    for delta in deltas:
        push(delta)
    checker.flush()
    return time.perf_counter() - start


def naive_stops(deltas: list[str]) -> float:
    start = time.perf_counter()
    text = ""
    for delta in deltas:
        text += delta
        for stop in STOPS:
            text.find(stop)
    return time.perf_counter() - start


def median_us(run: Callable[[], float], per: int, repeats: int) -> float:
    return statistics.median(run() for _ in range(repeats)) / per * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    tokenizer = Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))
    start = time.perf_counter()
    warm_up(tokenizer)
    table_ms = (time.perf_counter() - start) * 1e3
    prompt = tokenizer.encode(PROMPT).ids
    ids = generated_ids(tokenizer, args.tokens)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.push([i]) for i in ids]
    assert "".join(deltas) + detok.flush() == tokenizer.decode(ids)

    n, r = len(ids), args.repeats
    print(f"Qwen3 tokenizer, {n} generated tokens (mixed English/Chinese), 1 token per push, "
          f"median of {r} runs; byte table built once in {table_ms:.0f} ms")
    rows = [
        ("IncrementalDetokenizer.push", median_us(lambda: ours(tokenizer, prompt, ids), n, r)),
        ("tokenizers DecodeStream.step", median_us(lambda: decode_stream(tokenizer, prompt, ids), n, r)),
        ("naive: decode(all ids) per step", median_us(lambda: naive_detok(tokenizer, prompt, ids), n, r)),
        (f"StopChecker.push, stops={STOPS!r}", median_us(lambda: stop_checker(deltas), n, r)),
        ("naive: find stops in all text per step", median_us(lambda: naive_stops(deltas), n, r)),
    ]
    base = rows[0][1]
    for name, us in rows:
        print(f"  {name:<48} {us:9.3f} us/token  ({us / base:6.1f}x IncrementalDetokenizer)")


if __name__ == "__main__":
    main()
