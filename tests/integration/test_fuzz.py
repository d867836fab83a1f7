"""Fuzz: schemathesis against the frontend and the router, real processes over a sim engine, each
fuzzed from the /openapi.json it serves, with a fixed, derandomized budget (tests/support/fuzz.py).
No response may be a 5xx, no request may go unanswered past its timeout. The counts by status are
printed (pytest -s shows them; bench/fuzz.py runs a bigger budget)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fuzz import FuzzReport, fuzz, fuzz_fleet
from tests.support.procs import FrontendProc, HttpProc

# Per generation mode and POST operation. Measured with coverage of services/ (every process of the fleet):
# 20 reaches 7,293 lines, 60 reaches 7,202 (each reaches ~120-210 lines the other does not: the derandomized
# draws differ, and past ~20 more examples add requests, not lines), in a third of the requests and time.
EXAMPLES = 20
TIMEOUT_S = 15.0  # a request unanswered by then is a hang


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FrontendProc, HttpProc]]:
    with fuzz_fleet(Path(tmp_path_factory.mktemp("fuzz"))) as procs:
        yield procs


def _check(report: FuzzReport, logs: str) -> None:
    print("\n" + report.table())
    assert report.total >= EXAMPLES * 2, report.table()  # the budget was spent, not skipped
    assert report.bad() == 0 and not report.failures, "\n".join(report.failures) + "\n" + logs[-3000:]


def test_the_frontend_answers_every_generated_request_without_a_5xx(fleet: tuple[FrontendProc, HttpProc]) -> None:
    frontend, _ = fleet
    report = fuzz("frontend", frontend.url, examples=EXAMPLES, timeout_s=TIMEOUT_S)
    _check(report, frontend.log())
    assert {op for op, _ in report.counts} >= {f"POST {path}" for path in (
        "/v1/chat/completions", "/v1/completions", "/v1/chat/completions/render", "/v1/completions/render",
        "/inference/v1/generate", "/tokenize", "/detokenize")}
    assert report.by_status()["200"] > 0 and report.by_status()["400"] > 0  # both parsed and refused


def test_the_router_answers_every_generated_request_without_a_5xx(fleet: tuple[FrontendProc, HttpProc]) -> None:
    frontend, router = fleet
    report = fuzz("router", router.url, examples=EXAMPLES, timeout_s=TIMEOUT_S)
    _check(report, router.log() + frontend.log())
    assert {op for op, _ in report.counts} >= {f"POST /v1/{api}" for api in
                                               ("chat/completions", "completions", "responses", "messages",
                                                "messages/count_tokens", "router/explain")}
    assert report.by_status()["200"] > 0 and report.by_status()["400"] > 0
