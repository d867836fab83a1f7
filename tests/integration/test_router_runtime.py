"""The router's model runtime with real workers: managed deployments (our engine `--backend sim --runner
pooling` and a frontend per replica, started by the runtime as processes on loopback ports) and an
attached one (a frontend the test starts), answering embed and classify over real HTTP; a killed worker
is started again; the router process is ready only once its workers are, routes with a classifier
signal they answer, and takes them with it when it stops."""
from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.router.backends.aiohttp_upstream import AiohttpUpstream
from services.router.config import RouterConfig, parse_config
from services.router.runtime.deployments import Deployments
from tests.support.procs import (
    FrontendProc,
    HttpProc,
    pid_listening_on,
    start_engine,
    start_frontend,
    start_router,
)

SIM_POOLING = ("--backend", "sim", "--runner", "pooling")


_SIGNALS = {"embed": {"type": "embedding", "examples": ["x"]}, "classify": {"type": "classifier", "labels": ["code"]}}


def _runtime_config(deployments: dict[str, Any]) -> RouterConfig:
    """`deployments`, each named by a signal a decision reads: each is used."""
    signals = [{"name": f"s-{name}", "deployment": name, **_SIGNALS[d["tasks"][0]]} for name, d in deployments.items()]
    return parse_config({"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [
        {"url": "http://127.0.0.1:9"}]}}, "entries": {"e": {"default": ["p"], "signals": signals, "decisions": [
            {"when": {"any": [s["name"] for s in signals]}, "pools": ["p"]}]}}, "deployments": deployments})


async def _until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        await asyncio.sleep(0.05)


def _unit(vector: list[float]) -> bool:
    return math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)


def test_managed_workers_answer_are_started_again_when_killed_and_stop_with_the_runtime() -> None:
    config = _runtime_config({
        "emb": {"model": "tiny", "tasks": ["embed"], "managed": {"backend": "sim", "replicas": 2},
                "health": {"interval_s": 0.5, "failures": 1}},
        "cls": {"model": "tiny-classifier", "tasks": ["classify"], "managed": {"backend": "sim"}}})

    async def go() -> list[int]:
        upstream = AiohttpUpstream()
        runtime = Deployments(config, upstream)
        try:
            await runtime.start()
            emb = runtime.started["emb"]
            urls = [r.url for r in emb.managed]
            await asyncio.wait_for(runtime.wait_ready(), 240)
            ready, _, states = runtime.readiness()
            assert ready, states
            async with httpx.AsyncClient() as http:  # ready workers are ready as their frontends say
                ready_urls = [w["url"] for w in states["emb"]["workers"] if w["ready"]]
                assert ready_urls and [(await http.get(u + "/ready")).status_code for u in ready_urls] == \
                    [200] * len(ready_urls)

            out = await runtime.embed("emb", ["hello", "world", "hello"], timeout_s=30)
            assert out.worker in urls and len(out.vectors) == 3 and all(map(_unit, out.vectors))
            assert out.vectors[0] == out.vectors[2] != out.vectors[1]  # the sim's vectors: from the token ids
            [label] = (await runtime.classify("cls", ["def f(): pass"], timeout_s=30)).results
            assert set(label.probs) == {"chat", "code", "math"} and label.label in label.probs
            assert math.isclose(sum(label.probs.values()), 1.0, rel_tol=1e-4)

            # A killed frontend is started again (the same port), and its worker comes back. The
            # deployment is ready with one ready worker: wait for this one too (a loaded host is slow).
            replica = emb.managed[0]
            await _until(lambda: emb.pool.is_ready(emb.pool.replicas[0]), 120, "replica 0 ready")
            os.kill(pid_listening_on(replica.port), signal.SIGKILL)
            await _until(lambda: replica.frontend.restarts == 1, 30, "restart")
            await _until(lambda: emb.pool.is_ready(emb.pool.replicas[0]) and
                         replica.frontend.proc is not None and replica.frontend.proc.returncode is None,
                         120, "the restarted worker ready")
            # Equally loaded workers take calls in turn: four in a row reach both.
            workers = {(await runtime.embed("emb", ["again"], timeout_s=30)).worker for _ in range(4)}
            assert workers == set(urls)
            pids = [p.proc.pid for d in runtime.started.values() for r in d.managed
                    for p in (r.engine, r.frontend) if p.proc is not None]
        finally:
            await runtime.stop()
            await upstream.close()
        return pids

    pids = asyncio.run(go())
    assert len(pids) == 6 and not [pid for pid in pids if _alive(pid)], "a worker outlived the runtime's stop"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


@pytest.fixture(scope="module")
def attached_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    """A fleet frontend over a sim pooling engine, started by the test: what an attached deployment names."""
    tmp = tmp_path_factory.mktemp("attached")
    engine = start_engine(tmp, "--model", "tiny", *SIM_POOLING)
    try:
        fe = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                            "--engine-addresses", engine.endpoint())
        try:
            yield fe
        finally:
            fe.stop()
    finally:
        engine.stop()


def test_an_attached_deployment_calls_the_frontend_it_names(attached_worker: FrontendProc) -> None:
    config = _runtime_config({"emb": {"model": "tiny", "tasks": ["embed"],
                                      "attached": {"urls": [attached_worker.url]}}})

    async def go() -> list[list[float]]:
        upstream = AiohttpUpstream()
        runtime = Deployments(config, upstream)
        try:
            await runtime.start()
            await asyncio.wait_for(runtime.wait_ready(), 60)
            out = await runtime.embed("emb", ["hello"], timeout_s=30)
            assert out.worker == attached_worker.url
            return out.vectors
        finally:
            await runtime.stop()
            await upstream.close()

    [vector] = asyncio.run(go())
    assert _unit(vector)
    assert attached_worker.proc.poll() is None  # an attached worker is not the runtime's to stop


ROUTER = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  chat: {{model: tiny, replicas: [{{url: "http://127.0.0.1:9"}}]}}
entries:
  auto:
    signal_budget_s: 10  # a cold worker on a loaded test host can take more than the default 0.5 s
    signals:
      - {{name: topic, type: classifier, deployment: cls, labels: [code], threshold: 0.1}}
    decisions:
      - {{name: coding, when: topic, pools: [chat]}}
    default: [chat]
deployments:
  cls: {{model: tiny-classifier, tasks: [classify], managed: {{backend: sim}}, health: {{interval_s: 0.5}}}}
  emb: {{model: tiny, tasks: [embed], attached: {{urls: ["{attached}"]}}}}
  idle: {{model: tiny, tasks: [embed], managed: {{backend: sim}}}}
"""


def test_the_router_is_ready_after_its_workers_and_takes_them_with_it_on_sigterm(tmp_path: Path) -> None:
    router: HttpProc = start_router(tmp_path, ROUTER.format(attached="http://127.0.0.1:9"))
    try:
        deadline = time.monotonic() + 240
        while True:
            r = httpx.get(router.url + "/ready", timeout=5)
            if r.status_code == 200:
                break
            assert r.status_code == 503 and r.json()["status"] == "starting", r.text
            assert router.proc.poll() is None and time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        deployments = r.json()["deployments"]
        assert list(deployments) == ["cls"]  # emb and idle: no signal uses them, nothing started
        assert deployments["cls"]["used_by"] == ["signal entries.auto.signals[0] (topic, classifier)"]
        [worker] = deployments["cls"]["workers"]
        assert worker["ready"] and httpx.get(worker["url"] + "/ready", timeout=5).status_code == 200
        log = router.log()
        assert "deployment cls: started 1 managed sim worker(s) for tiny-classifier (tasks classify): used by " \
               "signal entries.auto.signals[0] (topic, classifier)" in log
        assert "deployment idle: not started: no signal uses it" in log
        # The signal is answered by the managed worker (the sim's classifier: any label, but named).
        decided = httpx.post(router.url + "/v1/router/explain", timeout=30, json={
            "model": "auto", "messages": [{"role": "user", "content": "fix my python code"}]}).json()
        topic = decided["signals"]["topic"]
        assert topic["worker"] == worker["url"] and not topic["unknown"] and topic["label"] in ("chat", "code", "math")
        frontend = pid_listening_on(int(worker["url"].rsplit(":", 1)[1]))
        engine = pid_listening_on(int(worker["engine"].rsplit(":", 1)[1]))
    finally:
        router.stop()
    assert router.proc.returncode == 0
    deadline = time.monotonic() + 30
    while _alive(frontend) or _alive(engine):
        assert time.monotonic() < deadline, f"workers outlived the router:\n{router.log()}"
        time.sleep(0.05)
