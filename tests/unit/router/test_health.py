"""The router's active health checks (backends/health.py) over a fake upstream (the port): a replica's
readiness follows its checks, and each change is logged once, going out at WARNING, back at INFO."""
from __future__ import annotations

import asyncio
import logging

import pytest

from services.router.backends.health import HealthChecker, pool_checks
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from tests.support.fake_upstream import FakeUpstream

A, B = "http://a:8000", "http://b:8000"


class _Checked(FakeUpstream):
    """Health checks answer as `passing` says, per replica URL."""

    def __init__(self) -> None:
        super().__init__()
        self.passing = {A: True, B: True}

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        ok = self.passing[url.removesuffix("/ready")]
        return ok, "HTTP 200" if ok else "HTTP 503"


def test_a_replica_going_out_and_back_is_logged_once_each_way_back_at_info(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config({"listeners": [{"port": 8080}],
                           "pools": {"p": {"model": "m", "replicas": [{"url": A}, {"url": B}],
                                           "health": {"path": "/ready", "failures": 1}}},
                           "entries": {"fleet": {"default": ["p"]}}})
    pools = build_pools(config)
    upstream = _Checked()
    checker = HealthChecker(pool_checks(config, pools), upstream)
    pool = pools["p"]

    def rounds(n: int) -> None:
        for _ in range(n):
            asyncio.run(checker.check_once("p"))

    with caplog.at_level(logging.INFO, logger="router.health"):
        rounds(2)
        upstream.passing[B] = False
        rounds(3)
        assert not pool.is_ready(pool.replicas[1]) and pool.is_ready(pool.replicas[0])
        upstream.passing[B] = True
        rounds(3)
    assert pool.is_ready(pool.replicas[1])
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [(logging.WARNING, f"pool p: replica {B} is not ready (HTTP 503)"),
                     (logging.INFO, f"pool p: replica {B} is ready (HTTP 200)")], lines
