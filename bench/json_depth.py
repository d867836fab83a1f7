"""What the JSON depth check (edge/json_depth.py) costs beside the msgspec decode it guards, on
typical 10 KB bodies and on 4 MB ones of several shapes, and on hostile ones. Best of N runs each.
Usage: .venv/bin/python bench/json_depth.py
"""
from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from edge.json_depth import MAX_DEPTH, too_deep

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"},
                                             "units": {"type": "string", "enum": ["c", "f"]}},
                                             "required": ["city"]}}}
CODE = "def f(x):\n    return {'a': [x[i] for i in range(3)]}  # \"quoted\"\n"


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def bodies() -> list[tuple[str, bytes]]:
    rng = random.Random(0)
    turns = [{"role": "user", "content": "Explain: def f(x): return [x[i] for i in range(3)] " * 3},
             {"role": "assistant", "content": 'Sure, here "it" is. ' * 20}] * 12
    return [
        ("10 KB chat, plain text", _body(messages=[{"role": "user", "content": "hello world " * 850}])),
        ("10 KB chat, code and 8 tools", _body(messages=turns, tools=[TOOL] * 8)),
        ("4 MB chat, prose", _body(messages=[{"role": "user", "content": "the quick brown fox. " * 200_000}])),
        ("4 MB chat, code", _body(messages=[{"role": "user", "content": CODE * 65_000}])),
        ("4 MB completion, token ids", _body(prompt=[rng.randrange(150_000) for _ in range(600_000)])),
        ("4 MB chat, 100k short messages", _body(messages=[{"role": "user", "content": "hi [x] {y}"}] * 100_000)),
        ("hostile: 1,000 deep", b'{"model":"m","tools":' + b"[" * 1000 + b"]" * 1000 + b"}"),
        ("hostile: 4 MB of [", b"[" * 2_000_000 + b"]" * 2_000_000),
    ]


def best(fn: Callable[[], object], budget_s: float = 1.0, runs: int = 200) -> float:
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < runs and (len(times) < 3 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes) -> None:
    try:
        decoder.decode(body)
    except RecursionError:  # what the check keeps from happening
        pass


def main() -> None:
    decoder = msgspec.json.Decoder()
    print(f"depth limit {MAX_DEPTH}; times are the best of up to 200 runs")
    print(f"{'body':32s} {'bytes':>9s} {'decode':>10s} {'check':>10s} {'check/decode':>12s}  refused")
    for name, body in bodies():
        decode_s = best(lambda body=body: _decode(decoder, body))
        check_s = best(lambda body=body: too_deep(body))
        print(f"{name:32s} {len(body):>9d} {decode_s * 1e6:>8.1f}us {check_s * 1e6:>8.1f}us "
              f"{check_s / decode_s:>11.2f}x  {too_deep(body)}")


if __name__ == "__main__":
    main()
