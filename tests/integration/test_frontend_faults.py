"""Faults seen through the frontend: /ready before and after a rank joins, an engine killed
mid-stream (error event, /ready names it, traffic moves at once, the rank rejoins after restart), a rank
of a supervised unit killed (the unit keeps serving and restarts it), an engine drained by SIGTERM, and
SIGUSR1 stack dumps from every process of a fleet."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import (
    EngineProc,
    descendants,
    free_port_block,
    pid_listening_on,
    start_engine,
    start_frontend,
    start_router,
)
from tests.support.waiting import until

SIM = ("--model", "tiny", "--backend", "sim")
CHAT = [{"role": "user", "content": "Hello there"}]


def _rank(tmp_path: Path, port: int, rank: int, *extra: str) -> EngineProc:
    """One headless rank as its own process on a fixed port (so it can be killed and restarted)."""
    return start_engine(tmp_path, *SIM, "--data-parallel-start-rank", str(rank), *extra, port=port)


def test_ready_is_503_until_a_rank_joins_then_200_naming_the_missing_one(tmp_path: Path) -> None:
    base = free_port_block(2)
    addresses = f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}"
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                        "--engine-addresses", addresses, wait_status=None)
    rank0 = rank1 = None
    try:
        body = fe.wait_ready(status=503)  # no rank can serve
        assert body["ready"] is False and body["ranks"] == [] and sorted(body["missing"]) == ["0", "1"], body
        rank0 = _rank(tmp_path, base, 0, "--sim-instant")
        body = fe.wait_ready(status=200, all_ranks=False)  # rank 0 serves; rank 1 is named
        assert body["ready"] is True and body["ranks"] == [0] and list(body["missing"]) == ["1"], body
        assert "connecting" in body["missing"]["1"]
        assert _completion(fe.url).headers["x-data-parallel-rank"] == "0"
        rank1 = _rank(tmp_path, base + 1, 1, "--sim-instant")
        assert fe.wait_ready(status=200) == {"ready": True, "ranks": [0, 1]}
        assert "engine rank 1 joined" in fe.log()
    finally:
        fe.stop()
        for rank in (rank0, rank1):
            if rank is not None:
                rank.stop()


def _completion(url: str, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                      headers=headers, timeout=30)


def _sse(url: str, max_tokens: int, *, on_event: Any = None, **headers: str) -> list[Any]:
    """A streamed completion's data payloads, JSON-decoded ([DONE] kept as the string); on_event(n)
    is called after the n-th one."""
    events: list[Any] = []
    with httpx.stream("POST", url + "/v1/completions", headers=headers, timeout=60,
                      json={"model": "tiny", "prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if on_event is not None:
                    on_event(len(events))
    return events


def test_engine_killed_mid_stream(tmp_path: Path) -> None:
    base = free_port_block(2)
    rank0 = _rank(tmp_path, base, 0, "--sim-decode-ms", "5")
    rank1 = _rank(tmp_path, base + 1, 1, "--sim-decode-ms", "5")
    addresses = f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}"
    # The heartbeat deadline is long on purpose: the rank must be found dead by its connection closing.
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                        "--engine-addresses", addresses, "--engine-timeout", "10.0")
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)
    pool = ThreadPoolExecutor(8)
    try:
        stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3000, stream=True,
                                                extra_headers={"X-Data-Parallel-Rank": "1"})
        received = 0
        burst = []
        with pytest.raises(openai.APIError) as err:
            for _ in stream:
                received += 1
                if received == 5:
                    killed_at = time.monotonic()
                    rank1.proc.kill()
                    # Requests arriving right after the kill, before any deadline: none may fail.
                    burst = [pool.submit(_completion, fe.url) for _ in range(8)]
        failed_after = time.monotonic() - killed_at
        assert "engine rank 1" in str(err.value)
        assert received < 3000
        print(f"stream failed {failed_after * 1000:.0f} ms after SIGKILL (heartbeat deadline 10 s)")
        answers = [f.result() for f in burst]
        assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
        assert {a.headers["x-data-parallel-rank"] for a in answers} == {"0"}
        rank1.proc.wait(10)
        ready = httpx.get(fe.url + "/ready")  # rank 0 still serves: the replica stays in service
        body = ready.json()
        assert ready.status_code == 200 and body["ranks"] == [0] and "connection closed" in body["missing"]["1"]
        # New work goes to the surviving rank.
        for _ in range(3):
            raw = client.chat.completions.with_raw_response.create(model="tiny", messages=CHAT, max_tokens=2)
            assert raw.headers["x-data-parallel-rank"] == "0"
        with pytest.raises(openai.APIStatusError) as pinned:
            client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2,
                                           extra_headers={"X-Data-Parallel-Rank": "1"})
        assert pinned.value.status_code == 503
        # The rank comes back by itself.
        rank1 = _rank(tmp_path, base + 1, 1, "--sim-instant")
        fe.wait_ready(status=200, timeout_s=30)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=CHAT, max_tokens=2, extra_headers={"X-Data-Parallel-Rank": "1"})
        assert raw.headers["x-data-parallel-rank"] == "1"
    finally:
        pool.shutdown()
        client.close()
        fe.stop()
        rank0.stop()
        rank1.stop()


def test_a_rank_of_a_supervised_unit_killed_mid_stream(tmp_path: Path) -> None:
    """One command serves two ranks; SIGKILL one: its stream fails at once, every new request is
    served by the other rank meanwhile, the unit starts the killed rank again and it rejoins."""
    port = free_port_block(2)
    fe = start_frontend(tmp_path, "--backend", "sim", "--data-parallel-size-local", "2", "--engine-port", str(port),
                        "--engine-arg=--sim-decode-ms=5")
    pool = ThreadPoolExecutor(4)
    try:
        victim = pid_listening_on(port + 1)
        burst = []

        def kill_at(n: int) -> None:
            if n == 5:
                os.kill(victim, signal.SIGKILL)
                burst.extend(pool.submit(_completion, fe.url) for _ in range(8))

        events = _sse(fe.url, 3000, on_event=kill_at, **{"X-Data-Parallel-Rank": "1"})
        assert events[-1] == "[DONE]" and "engine rank 1" in events[-2]["error"]["message"]
        answers = [f.result() for f in burst]
        assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
        assert {a.headers["x-data-parallel-rank"] for a in answers} == {"0"}
        assert fe.wait_ready(status=200, timeout_s=60) == {"ready": True, "ranks": [0, 1]}
        assert _completion(fe.url, **{"X-Data-Parallel-Rank": "1"}).status_code == 200
        assert pid_listening_on(port + 1) != victim
        assert fe.proc.poll() is None and "engine-rank-1 was killed by SIGKILL; starting it again" in fe.log()
    finally:
        pool.shutdown()
        assert fe.stop() == 0


def test_an_engine_drained_by_sigterm_finishes_or_ends_its_streams_and_traffic_moves(tmp_path: Path) -> None:
    base = free_port_block(2)
    rank0 = _rank(tmp_path, base, 0, "--sim-decode-ms", "5")
    rank1 = _rank(tmp_path, base + 1, 1, "--sim-decode-ms", "5", "--drain-timeout", "2")
    addresses = f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}"
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                        "--engine-addresses", addresses)
    pool = ThreadPoolExecutor(4)
    try:
        started = threading.Barrier(3, timeout=30)

        def stream(max_tokens: int) -> list[Any]:
            return _sse(fe.url, max_tokens, on_event=lambda n: n == 3 and started.wait(),
                        **{"X-Data-Parallel-Rank": "1"})

        short, long = pool.submit(stream, 200), pool.submit(stream, 3000)  # ~1 s and ~15 s of decoding
        started.wait()
        rank1.proc.send_signal(signal.SIGTERM)
        rank1.wait_log("draining")
        answers = [_completion(fe.url) for _ in range(6)]  # the draining rank takes no new work
        assert [a.status_code for a in answers] == [200] * 6
        assert {a.headers["x-data-parallel-rank"] for a in answers} == {"0"}
        finished = short.result(timeout=30)
        assert finished[-1] == "[DONE]" and finished[-2]["choices"][0]["finish_reason"] == "length"
        cut = long.result(timeout=30)  # still running at the drain deadline
        assert cut[-1] == "[DONE]" and "drain deadline" in cut[-2]["error"]["message"]
        assert rank1.proc.wait(30) == 0
    finally:
        pool.shutdown()
        fe.stop()
        rank0.stop()
        rank1.stop()


def test_a_frontend_drained_by_sigterm_finishes_or_ends_its_streams_at_the_deadline(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "5")
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--shutdown-timeout", "2")
    pool = ThreadPoolExecutor(4)
    try:
        started = threading.Barrier(5, timeout=30)

        def stream(max_tokens: int) -> list[Any]:
            return _sse(fe.url, max_tokens, on_event=lambda n: n == 3 and started.wait())

        short = [pool.submit(stream, 100) for _ in range(2)]  # well within the timeout
        long = [pool.submit(stream, 3000) for _ in range(2)]  # ~15 s: still running at the deadline
        started.wait()
        signalled = time.monotonic()
        fe.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (ready := httpx.get(fe.url + "/ready", timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.02)
        assert ready.json() == {"ready": False, "draining": True}
        refused = _completion(fe.url)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        for f in short:
            events = f.result(timeout=30)
            assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        for f in long:
            events = f.result(timeout=30)
            assert events[-1] == "[DONE]" and "--shutdown-timeout 2s" in events[-2]["error"]["message"]
        ended = time.monotonic() - signalled
        assert fe.proc.wait(30) == 0
        print(f"frontend SIGTERM: long streams ended {ended:.2f} s after the signal (--shutdown-timeout 2), "
              f"process exited after {time.monotonic() - signalled:.2f} s")
        assert "Traceback" not in fe.log() and "ending 2 request(s) still running" in fe.log()
    finally:
        pool.shutdown()
        fe.stop()
        engine.stop()


def test_managed_mode_starts_supervises_and_stops_its_engines(tmp_path: Path) -> None:
    port = free_port_block(2)
    fe = start_frontend(tmp_path, "--backend", "sim", "--data-parallel-size-local", "2", "--engine-port", str(port),
                        "--engine-arg=--sim-instant")
    try:
        with openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
            ranks = {client.completions.with_raw_response.create(model="tiny", prompt="hi", max_tokens=2)
                     .headers["x-data-parallel-rank"] for _ in range(4)}
        assert ranks == {"0", "1"}
        assert httpx.get(fe.url + "/ready").json() == {"ready": True, "ranks": [0, 1]}
        # Given no token, it made one for its engines: another user of this host reaches loopback too.
        from services.engine.probe import probe

        ok, said = probe("127.0.0.1", port, 10)
        assert not ok and "unauthorized" in said, said
    finally:
        assert fe.stop() == 0
    # The engines went with it: their ports are free again.
    import socket

    for p in (port, port + 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_long_engine_steps_keep_the_rank_alive_but_a_stall_does_not(tmp_path: Path) -> None:
    base = free_port_block(2)
    slow = _rank(tmp_path, base, 0, "--sim-decode-ms", "2500")  # each step longer than the deadline
    stuck = _rank(tmp_path, base + 1, 1, "--sim-decode-ms", "2500", "--stall-timeout", "0.5")
    addresses = f"tcp://127.0.0.1:{base},tcp://127.0.0.1:{base + 1}"
    # Rank 1 goes silent 0.5 s into each 2.5 s step: slow 1 s later, dead 1.2 s later, before the step ends.
    fe = start_frontend(tmp_path, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                        "--engine-addresses", addresses, "--engine-timeout", "1.0", "--engine-dead-timeout", "1.2")
    try:
        with openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60) as client:
            r = client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                          extra_headers={"X-Data-Parallel-Rank": "0"})
            assert r.choices[0].finish_reason == "length"  # two 2.5 s steps, the rank stayed alive
            with pytest.raises(openai.APIStatusError) as err:
                client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                          extra_headers={"X-Data-Parallel-Rank": "1"})
            assert err.value.status_code == 503 and "engine rank 1" in str(err.value)
        log = fe.log()
        assert "engine rank 0 is slow" not in log and "engine rank 0 is dead" not in log
        assert "engine rank 1 is slow" in log and "engine rank 1 is dead" in log
    finally:
        fe.stop()
        slow.stop()
        stuck.stop()


def test_a_frontend_that_did_not_run_for_longer_than_the_deadline_keeps_its_engines(tmp_path: Path) -> None:
    """The frontend stopped (SIGSTOP) past its engine deadline: the engine's Stats wait in ZMQ's
    queue meanwhile, so on waking it must not call the engine dead (a stalled frontend once failed
    every stream with "no heartbeat"). The stream in flight carries on to its end."""
    base = free_port_block(1)
    engine = _rank(tmp_path, base, 0, "--sim-decode-ms", "20")
    fe = start_frontend(tmp_path, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                        "--engine-addresses", f"tcp://127.0.0.1:{base}", "--engine-timeout", "1.0")
    try:
        with openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60) as client:
            stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=150, stream=True,
                                                    extra_body={"ignore_eos": True})
            chunks = iter(stream)
            next(chunks)
            os.kill(fe.proc.pid, signal.SIGSTOP)
            time.sleep(2.5)  # past the frontend's 1 s deadline, within the engine's 5 s client timeout
            os.kill(fe.proc.pid, signal.SIGCONT)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"]
        assert "is dead" not in fe.log() and "did not run for" in fe.log()
        assert fe.wait_ready(status=200)["ready"] is True
    finally:
        os.kill(fe.proc.pid, signal.SIGCONT)
        fe.stop()
        engine.stop()


def test_sigusr1_has_every_service_process_write_its_stacks_and_keep_serving(tmp_path: Path) -> None:
    """`kill -USR1` on each process of a fleet (a router, a frontend, its engine unit's supervisor and two
    ranks): each writes every thread's stack to its log, and the fleet answers as before and stops cleanly."""
    fe = start_frontend(tmp_path, "--backend", "sim", "--data-parallel-size-local", "2",
                        "--engine-port", str(free_port_block(2)), "--engine-arg=--sim-instant")
    router = None
    try:
        router = start_router(tmp_path, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, replicas: [{{url: {fe.url}}}]}}
entries:
  fleet: {{default: [p]}}
""")
        unit = [p for p in descendants(fe.proc.pid) if b"services.engine" in Path(f"/proc/{p}/cmdline").read_bytes()]
        ranks = [p for p in descendants(unit[0]) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(unit) == 1 and len(ranks) == 2, (unit, ranks)
        expected = {router.proc.pid: (router, "services/router/__main__.py"),
                    fe.proc.pid: (fe, "services/frontend/__main__.py"),
                    unit[0]: (fe, "in supervise"),
                    ranks[0]: (fe, "in _rank_process"), ranks[1]: (fe, "in _rank_process")}
        for pid, (proc, frame) in expected.items():
            before = proc.log().count(frame)
            os.kill(pid, signal.SIGUSR1)
            until(f"pid {pid}: a stack naming {frame!r}", lambda: proc.log().count(frame) > before or None,  # noqa: B023
                  timeout_s=10, every_s=0.05)
        r = httpx.post(router.url + "/v1/chat/completions", timeout=30,
                       json={"model": "fleet", "messages": CHAT, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert {_completion(fe.url, **{"X-Data-Parallel-Rank": str(rank)}).status_code for rank in (0, 1)} == {200}
    finally:
        codes = [router.stop() if router is not None else 0, fe.stop()]  # both stopped whatever happened
    assert codes == [0, 0]
