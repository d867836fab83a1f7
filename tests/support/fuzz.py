"""Schemathesis against a running service: every operation of its /openapi.json is sent a fixed number
of generated requests, schema-conforming (positive) and not (negative), derandomized so that a run is
the same run each time. Each answer is counted by status; a 5xx, a request past its timeout (a hang)
or a dropped connection is a failure, kept with the request that caused it.
Used by tests/integration/test_fuzz.py and bench/fuzz.py."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support.procs import FrontendProc, HttpProc, start_engine, start_frontend, start_router

MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
MAX_MODEL_LEN = 256  # bounds what a generated request can ask to generate
ROUTER_CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {frontend}}}], health: {{path: /ready, interval_s: 1}}}}
entries:
  fleet:
    signals: [{{name: long, type: context_length, min_tokens: 100}}, {{name: code, type: keyword, keywords: [def]}}]
    decisions: [{{name: long, when: long, pools: [tiny]}}, {{name: code, when: code, pools: [tiny]}}]
    default: [tiny]
"""


@contextmanager
def fuzz_fleet(tmp: Path) -> Iterator[tuple[FrontendProc, HttpProc]]:
    """A sim engine (steps take no time), a frontend on it, and a router in front with one entry
    ("fleet", with signals) on one pool: each a process of its own."""
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-instant",
                          "--max-model-len", str(MAX_MODEL_LEN))
    procs: list[Any] = [engine]
    try:
        frontend = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                  "--engine-addresses", engine.endpoint())
        procs.append(frontend)
        router = start_router(tmp, ROUTER_CONFIG.format(frontend=frontend.url))
        procs.append(router)
        yield frontend, router
    finally:
        for proc in reversed(procs):
            proc.stop()


@dataclass
class FuzzReport:
    service: str
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (operation, status) -> requests
    failures: list[str] = field(default_factory=list)  # what was sent and what came back, for each failure

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_status(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (_, status), n in self.counts.items():
            out[status] += n
        return out

    def bad(self) -> int:
        """Responses 5xx, hangs and dropped connections."""
        return sum(n for status, n in self.by_status().items() if not status.isdigit() or int(status) >= 500)

    def table(self) -> str:
        statuses = sorted(self.by_status())
        width = max(len(op) for op, _ in self.counts) if self.counts else 10
        lines = [f"{self.service}: {self.total} requests, {self.bad()} 5xx/hangs",
                 f"  {'operation':{width}s} " + " ".join(f"{s:>7s}" for s in statuses)]
        for op in sorted({op for op, _ in self.counts}):
            lines.append(f"  {op:{width}s} " + " ".join(f"{self.counts[op, s]:>7d}" for s in statuses))
        lines.append(f"  {'all':{width}s} " + " ".join(f"{self.by_status()[s]:>7d}" for s in statuses))
        return "\n".join(lines)


def fuzz(service: str, base_url: str, *, examples: int, timeout_s: float,
         headers: dict[str, str] | None = None, get_examples: int = 3) -> FuzzReport:
    """`examples` requests per mode for each POST operation, `get_examples` for each GET."""
    report = FuzzReport(service)
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", headers=headers or {}, timeout=timeout_s)
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        name = f"{operation.method.upper()} {operation.path}"
        budget = examples if operation.method.upper() == "POST" else get_examples
        for mode in MODES:
            _run(report, name, operation.as_strategy(generation_mode=mode), budget, base_url, headers or {},
                 timeout_s, session)
    return report


def _run(report: FuzzReport, name: str, strategy: Any, budget: int, base_url: str, headers: dict[str, str],
         timeout_s: float, session: requests.Session) -> None:
    @settings(max_examples=budget, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(case=strategy)
    def send(case: Any) -> None:
        try:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=timeout_s)
        except requests.Timeout:
            report.counts[name, "hang"] += 1
            report.failures.append(f"{name}: no answer within {timeout_s}s to {_sent(case)}")
            return
        except requests.ConnectionError as exc:
            report.counts[name, "dropped"] += 1
            report.failures.append(f"{name}: connection failed ({exc}) on {_sent(case)}")
            return
        status = response.status_code
        report.counts[name, str(status)] += 1
        if status >= 500:
            report.failures.append(f"{name}: {status} {response.content[:300]!r} to {_sent(case)}")

    try:
        send()
    except Unsatisfiable:  # nothing of this mode to generate (a negative GET with no parameters)
        pass


def _sent(case: Any) -> str:
    body = case.body if not isinstance(case.body, bytes) else case.body[:300]
    try:
        shown = json.dumps(body)[:600]
    except (TypeError, ValueError):
        shown = repr(body)[:600]
    return f"headers={dict(case.headers or {})} body={shown}"
