"""A real Prometheus (Debian's `prometheus` package) for tests: started on a free loopback port with its
own TSDB directory, given a config derived from the shipped deploy/observability/prometheus.yml with only
the targets rewritten, and asked over its HTTP API. Run by the test process; stopped with its group."""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.procs import free_port_block, group_gone
from tests.support.waiting import until

BINARY = Path("/usr/bin/prometheus")
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "observability" / "prometheus.yml"


def derived_config(targets: Mapping[str, str], interval_s: int = 1, shipped: Path = SHIPPED) -> dict[str, Any]:
    """The shipped config with each static target replaced by `targets[target]` (every one must be
    mapped: a target the test does not know is an error naming it) and the scrape and evaluation
    intervals set to `interval_s`. Jobs, metrics paths, labels and relabelling stay as shipped."""
    config: dict[str, Any] = yaml.safe_load(shipped.read_text())
    glob = config.setdefault("global", {})
    glob.update(scrape_interval=f"{interval_s}s", scrape_timeout=f"{interval_s}s", evaluation_interval=f"{interval_s}s")
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            unknown = [t for t in static["targets"] if t not in targets]
            if unknown:
                raise ValueError(f"job {job['job_name']}: targets {unknown} have no test address; "
                                 f"mapped: {sorted(targets)}")
            static["targets"] = [targets[t] for t in static["targets"]]
        for key in job:
            if key.endswith("_sd_configs"):
                raise ValueError(f"job {job['job_name']}: {key} is not rewritten; only static_configs are")
    return config


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    interval_s: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, **params: str | float) -> Any:
        """`data` of a /api/v1 answer; an AssertionError with Prometheus's error (a bad query) otherwise."""
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = r.json()
        assert r.status_code == 200 and body.get("status") == "success", \
            f"/api/v1/{path} {params}: HTTP {r.status_code}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def scraped_after(self, moment: float, timeout_s: float = 30.0) -> None:
        """Until every active target was scraped, successfully, after `moment` (wall clock, seconds)."""
        def fresh() -> bool | None:
            targets = self.targets()
            done = targets and all(t["health"] == "up" and _epoch(t["lastScrape"]) > moment for t in targets)
            return True if done else None

        until(f"every target scraped after {moment:.3f} ({self.targets()})", fresh, timeout_s, every_s=0.2)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step_s)
        return list(data["result"])

    def stop(self) -> int:
        """SIGTERM to its process group (SIGKILL after 20 s); the exit code once the group is gone."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        assert group_gone(self.proc.pid), f"prometheus left processes behind (group {self.proc.pid})"
        return code


def finite(result: list[dict[str, Any]]) -> bool:
    """Whether a range query's result holds a number a panel would draw (histogram_quantile over
    windows without observations gives NaN: Grafana draws nothing)."""
    return any(math.isfinite(float(v)) for series in result for _, v in series.get("values", []))


def _epoch(rfc3339: str) -> float:
    """Prometheus's lastScrape (RFC 3339, nanoseconds, Z or an offset) as epoch seconds."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m is not None, f"lastScrape {rfc3339!r}: not RFC 3339"
    whole = datetime.fromisoformat(m.group(1) + (m.group(3).replace("Z", "+00:00")))
    return whole.timestamp() + float(m.group(2) or 0.0)


@contextmanager
def running(tmp_path: Path, targets: Mapping[str, str], interval_s: int = 1) -> Iterator[Prometheus]:
    """Prometheus on the shipped config, its targets rewritten to `targets`, ready to query; stopped
    (its whole process group) on exit."""
    assert BINARY.exists(), (f"{BINARY} is missing: install Debian's `prometheus` package "
                             "(apt-get install -y prometheus); the dashboard tests run the real one")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(derived_config(targets, interval_s)))
    port = free_port_block(1, spread=0)
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(BINARY), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    prometheus = Prometheus(proc, port, log_path, interval_s)
    try:
        def ready() -> bool | None:
            assert proc.poll() is None, f"prometheus exited ({proc.returncode}):\n{prometheus.log()}"
            try:
                return True if httpx.get(prometheus.url + "/-/ready", timeout=2).status_code == 200 else None
            except httpx.TransportError:
                return None

        until(f"prometheus ready on {prometheus.url}", ready, 60)
        yield prometheus
    finally:
        code = prometheus.stop()
    assert code == 0, f"prometheus exited {code}:\n{prometheus.log()}"  # not over the body's own failure


def wait_scraped(prometheus: Prometheus) -> float:
    """Now (wall clock), once every target has been scraped after it: what it served is queryable."""
    moment = time.time()
    prometheus.scraped_after(moment)
    return moment
