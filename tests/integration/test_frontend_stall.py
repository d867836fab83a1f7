"""Slow is not dead, with real sim engines and a real frontend: a rank stopped (SIGSTOP) past
--engine-timeout takes no new requests meanwhile but keeps its streams, which finish once it runs
again (SIGCONT); stopped past --engine-dead-timeout, its streams fail naming the deadline, and it
rejoins when it runs again. /ready stays 200 while the other rank serves. And a rank killed while
requests wait on it with no output yet: the other rank answers them."""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol.grpc import pb2, pb2_grpc
from tests.support.procs import EngineProc, FrontendProc, free_port_block, start_engine, start_frontend

SIM = ("--model", "tiny", "--backend", "sim")


def _fleet(tmp_path: Path, *frontend_args: str) -> tuple[list[EngineProc], FrontendProc]:
    base = free_port_block(2)
    ranks = [start_engine(tmp_path, *SIM, "--data-parallel-start-rank", str(r), "--sim-decode-ms", "5",
                          port=base + r) for r in (0, 1)]
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0", "--engine-addresses",
                        f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}", *frontend_args)
    return ranks, fe


def _stream(url: str, rank: int, max_tokens: int, started: threading.Barrier) -> list[Any]:
    """A streamed completion pinned to `rank`: its data payloads ([DONE] kept as the string); waits on
    `started` after its third event."""
    events: list[Any] = []
    with httpx.stream("POST", url + "/v1/completions", headers={"X-Data-Parallel-Rank": str(rank)}, timeout=60,
                      json={"model": "tiny", "prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if len(events) == 3:
                    started.wait()
    return events


def _ready_until(fe: FrontendProc, condition: Any, timeout_s: float = 30) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while not condition(ready := httpx.get(fe.url + "/ready", timeout=5)):
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.05)
    return ready


def test_a_rank_stopped_past_the_short_deadline_keeps_its_streams_and_takes_no_new_work(tmp_path: Path) -> None:
    grpc_port = free_port_block(1, spread=0)
    # the default deadlines: --engine-timeout 2, --engine-dead-timeout 10
    ranks, fe = _fleet(tmp_path, "--grpc-port", str(grpc_port))
    control = pb2_grpc.ControlStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    pool = ThreadPoolExecutor(8)
    victim = ranks[1].proc.pid
    stopped = False
    try:
        started = threading.Barrier(5, timeout=30)
        streams = [pool.submit(_stream, fe.url, rank, 600, started) for rank in (0, 0, 1, 1)]  # ~3 s of decoding
        started.wait()
        os.kill(victim, signal.SIGSTOP)
        stopped, stopped_at = True, time.monotonic()
        ready = _ready_until(fe, lambda r: "1" in r.json().get("missing", {}))
        assert ready.status_code == 200 and ready.json()["ranks"] == [0], ready.text  # the replica still serves
        assert ready.json()["missing"]["1"].startswith("slow: no message for")
        # gRPC says the same: a client balancing on GetLoads or GetServerInfo must skip the slow rank too
        assert list(control.GetServerInfo(pb2.GetServerInfoRequest(), timeout=5).ready_ranks) == [0]
        assert [r.state for r in control.GetLoads(pb2.GetLoadsRequest(), timeout=5).ranks] == ["ready", "slow"]
        answers = [httpx.post(fe.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                              timeout=30) for _ in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        assert {a.headers["x-data-parallel-rank"] for a in answers} == {"0"}
        assert not any(f.done() for f in streams[2:])  # rank 1's streams wait, neither failed nor finished
        while time.monotonic() - stopped_at < 3.0:  # a 3 s stall, as a long GC pause or a noisy neighbour
            assert _ready_until(fe, lambda r: True).json()["ranks"] == [0]
            time.sleep(0.1)
        os.kill(victim, signal.SIGCONT)
        stopped = False
        for f in streams:
            events = f.result(timeout=60)
            assert events[-1] == "[DONE]" and "error" not in events[-2], events[-2]
            assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert _ready_until(fe, lambda r: r.json() == {"ready": True, "ranks": [0, 1]}).status_code == 200
        log = fe.log()
        assert "engine rank 1 is slow" in log and "engine rank 1 speaks again" in log and "is dead" not in log
    finally:
        if stopped:
            os.kill(victim, signal.SIGCONT)
        pool.shutdown()
        fe.stop()
        for rank in ranks:
            rank.stop()


def test_a_rank_stopped_past_the_dead_deadline_fails_its_streams_then_rejoins(tmp_path: Path) -> None:
    grpc_port = free_port_block(1, spread=0)
    ranks, fe = _fleet(tmp_path, "--engine-timeout", "1", "--engine-dead-timeout", "2.5", "--grpc-port", str(grpc_port))
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    pool = ThreadPoolExecutor(4)
    victim = ranks[1].proc.pid
    stopped = False
    try:
        started = threading.Barrier(3, timeout=30)
        streams = [pool.submit(_stream, fe.url, rank, 3000, started) for rank in (0, 1)]  # ~15 s of decoding
        started.wait()
        os.kill(victim, signal.SIGSTOP)
        stopped = True
        events = streams[1].result(timeout=30)  # the stopped rank's stream fails at the dead deadline
        assert events[-1] == "[DONE]"
        message = events[-2]["error"]["message"]
        assert "engine rank 1 failed: no message for" in message and "--engine-dead-timeout 2.5s" in message
        ready = httpx.get(fe.url + "/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["missing"]["1"].startswith("dead: no message for")
        assert not streams[0].done()  # the other rank's stream goes on
        # gRPC's health service says what /ready says: a gRPC probe must not drop a replica that serves either
        deadline = time.monotonic() + 10  # it follows the engines' state changes
        while (status := health.Check(health_pb2.HealthCheckRequest(), timeout=5).status) != \
                health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == health_pb2.HealthCheckResponse.SERVING
        os.kill(victim, signal.SIGCONT)
        stopped = False
        _ready_until(fe, lambda r: r.json() == {"ready": True, "ranks": [0, 1]})  # it rejoins by handshake
        again = httpx.post(fe.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                           headers={"X-Data-Parallel-Rank": "1"}, timeout=30)
        assert again.status_code == 200
        events = streams[0].result(timeout=60)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    finally:
        if stopped:
            os.kill(victim, signal.SIGCONT)
        pool.shutdown()
        fe.stop()
        for rank in ranks:
            rank.stop()


def test_requests_on_a_rank_killed_before_their_first_token_are_answered_by_the_other(tmp_path: Path) -> None:
    base = free_port_block(2)
    # Rank 1 prefills 5 tokens a second: a request waits there for seconds before its first token.
    ranks = [start_engine(tmp_path, *SIM, "--data-parallel-start-rank", "0", "--sim-instant", port=base),
             start_engine(tmp_path, *SIM, "--data-parallel-start-rank", "1", "--sim-prefill-tps", "5",
                          port=base + 1)]
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0", "--engine-addresses",
                        f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}")
    pool = ThreadPoolExecutor(4)
    try:
        calls = [pool.submit(httpx.post, fe.url + "/v1/completions", timeout=60,
                             json={"model": "tiny", "prompt": "hello there", "max_tokens": 2}) for _ in range(4)]
        deadline = time.monotonic() + 30
        on_rank_1 = re.compile(r'^fleet:engine_streams_open\{engine="1",model_name="tiny"\} ([1-9])', re.M)
        while not on_rank_1.search(httpx.get(fe.url + "/metrics", timeout=5).text):
            assert time.monotonic() < deadline and not all(c.done() for c in calls)
            time.sleep(0.02)
        ranks[1].proc.kill()
        answers = [c.result(timeout=60) for c in calls]
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        assert {a.headers["x-data-parallel-rank"] for a in answers} == {"0"}
        assert "did not start it" in fe.log()
    finally:
        pool.shutdown()
        fe.stop()
        for rank in ranks:
            rank.stop()
