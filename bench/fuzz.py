"""Fuzz request counts by status code: schemathesis against the frontend and the router, each serving
its /openapi.json, both real processes over a sim engine (tests/support/fuzz.py, as `make test` runs
it in tests/integration/test_fuzz.py, there with a smaller budget). Prints a table per service and
every 5xx or hang with the request that caused it; exits 1 if there was any.
Usage: .venv/bin/python bench/fuzz.py [--examples 100] [--timeout 15]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fuzz import fuzz, fuzz_fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="requests per mode for each POST operation")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds a request may take before it is a hang")
    args = parser.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp, fuzz_fleet(Path(tmp)) as (frontend, router):
        for name, proc in (("frontend", frontend), ("router", router)):
            started = time.perf_counter()
            report = fuzz(name, proc.url, examples=args.examples, timeout_s=args.timeout)
            print(report.table())
            print(f"  ({time.perf_counter() - started:.1f} s)")
            for failure in report.failures:
                print("  FAIL", failure)
            bad += report.bad()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
