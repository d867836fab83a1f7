"""Stop strings at the request limits: the time to prepare a StopChecker, and per streamed token (4
characters a push) the time to match, on text that never begins a stop string and on text that keeps
running along them (held back, then released).

Run: .venv/bin/python bench/stop_strings.py [--before REV] [--repeats 5]
`--before REV` also times the StopChecker of that git revision (e.g. 8f7d86b, before the automaton;
its preparation is quadratic in a string's length, so its 16k-character case is left out).
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

# Runnable as a plain script from a checkout that is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS, StopChecker

ROOT = Path(__file__).resolve().parents[1]

TOKENS = 4000
CHARS_PER_TOKEN = 4


def cases() -> dict[str, list[str]]:
    rng = random.Random(1)
    size = MAX_STOP_CHARS // MAX_STOP_STRINGS

    def word(n: int, alphabet: str) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    return {
        f"{MAX_STOP_STRINGS} x {size} chars (the largest list)":
            [word(size, "abcdefgh ") for _ in range(MAX_STOP_STRINGS)],
        "1 x 5,000 chars": [word(5000, "abcdefgh ")],
        f"1 x {MAX_STOP_CHARS:,} chars (the longest string)": [word(MAX_STOP_CHARS, "abcdefgh ")],
        "2 short (</answer>x, \\n\\nUser:)": ["</answer>x", "\n\nUser:"],
    }


def texts(stops: list[str]) -> dict[str, list[str]]:
    """4-character deltas: prose that never begins a stop, and a text made of long runs of the stops."""
    rng = random.Random(2)
    prose = "".join(rng.choice("ijklmnopqrstuvwxyz .,") for _ in range(TOKENS * CHARS_PER_TOKEN))
    runs = ""
    while len(runs) < TOKENS * CHARS_PER_TOKEN:
        stop = rng.choice(stops)
        runs += stop[: rng.randint(1, len(stop) - 1)] if len(stop) > 1 else "."
    step = CHARS_PER_TOKEN
    return {name: [text[i:i + step] for i in range(0, TOKENS * step, step)]
            for name, text in (("prose", prose), ("runs along the stops", runs))}


def prepare_time(cls: type, stops: list[str], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        cls(stops)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def match_time(cls: type, stops: list[str], deltas: list[str], repeats: int) -> float:
    """Seconds in push() for all the deltas (a new checker, made off the clock, after any match)."""
    samples = []
    for _ in range(repeats):
        checker, spent = cls(stops), 0.0
        for delta in deltas:
            start = time.perf_counter()
            matched = checker.push(delta)[1]
            spent += time.perf_counter() - start
            if matched is not None:
                checker = cls(stops)
        samples.append(spent)
    return statistics.median(samples)


def checker_at(rev: str) -> type:
    """StopChecker as it was at a git revision, loaded from `git show` without checking it out."""
    for path in ("services/frontend/text/stop_strings.py", "services/frontend/stop_strings.py"):  # before text/
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            break
    shown.check_returncode()
    module = types.ModuleType(f"stop_strings_{rev}")
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module.StopChecker  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", metavar="REV", help="also time the StopChecker of this git revision")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    versions: list[tuple[str, type]] = [("now", StopChecker)]
    if args.before:
        versions.append((args.before, checker_at(args.before)))
    print(f"median of {args.repeats}; match time per token of {CHARS_PER_TOKEN} characters over {TOKENS} tokens "
          "(the clock around push() alone, which adds ~0.1 us)")
    for case, stops in cases().items():
        deltas = texts(stops)
        for label, cls in versions:
            if label != "now" and len(max(stops, key=len)) > 5000:
                print(f"  {case:<44} {label:>8}: (skipped: quadratic)")
                continue
            repeats = 1 if label != "now" and len(max(stops, key=len)) > 1000 else args.repeats
            prepare = prepare_time(cls, stops, repeats)
            per_token = {name: match_time(cls, stops, d, repeats) / TOKENS * 1e6 for name, d in deltas.items()}
            cols = ", ".join(f"{name} {us:.2f} us" for name, us in per_token.items())
            print(f"  {case:<44} {label:>8}: prepare {prepare * 1e3:9.2f} ms; per token: {cols}")


if __name__ == "__main__":
    main()
