"""The router's streaming relay (listeners/relay.py over backends/aiohttp_upstream.py), a router process in
front of a test backend process: a stalled upstream is cut by the pool's `timeout_s`, and a client that
reads slowly is not taken for one."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import HttpProc, start_backend, start_router
from tests.support.waiting import until


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    proc = start_backend(tmp_path_factory.mktemp("relay"), "a")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, backend: HttpProc) -> Iterator[HttpProc]:
    proc = _router(tmp_path_factory.mktemp("relay-router"), backend, timeout_s=0.3)
    yield proc
    proc.stop()


def _router(tmp_path: Path, backend: HttpProc, timeout_s: float) -> HttpProc:
    return start_router(tmp_path, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p:
    model: m
    replicas: [{{url: {backend.url}}}]
    timeout_s: {timeout_s}
entries:
  fleet: {{default: [p]}}
""")


def _stream(router: HttpProc) -> httpx.Response:
    return httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json={  # type: ignore[return-value]
        "model": "fleet", "stream": True, "messages": [{"role": "user", "content": "x"}]})


def test_a_stream_that_stalls_mid_way_ends_with_an_error_and_is_closed_upstream(
        router: HttpProc, backend: HttpProc) -> None:
    backend.reset()
    backend.configure(chunks=3, chunk_delay_s=2.0)  # silent 2 s after each chunk: past the pool's 0.3 s
    with _stream(router) as r:  # type: ignore[attr-defined]
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(lines) == 2, lines  # the first chunk, then the error event in its place
    assert "upstream failed mid-stream" in lines[-1] and "data: [DONE]" not in lines
    # The stalled request was closed, which the backend sees once it wakes to send its next chunk.
    until("the backend saw the router close the stalled stream",
          lambda: True if backend.stats()["disconnected"] == 1 else None, timeout_s=10)


def test_a_slow_reader_is_not_taken_for_a_stalled_upstream(router: HttpProc, backend: HttpProc) -> None:
    """The stall bound counts the time the relay waits on upstream, never the time it waits on a client
    that reads slowly (backpressure): here the client reads nothing for five times the pool's timeout_s,
    with more bytes in flight than the sockets between hold, then reads to the end."""
    backend.reset()
    backend.configure(chunks=100, reply="y" * 16_000_000)  # 16 MB in 100 events, sent at once
    with _stream(router) as r:  # type: ignore[attr-defined]
        assert r.status_code == 200
        time.sleep(1.5)  # the slow reader itself (not a wait for something): nothing read meanwhile
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-1][:200]
    assert len(lines) == 101 and sum(len(line) for line in lines) > 16_000_000
    assert backend.stats()["disconnected"] == 0


def _rss_kib(proc: HttpProc) -> int:
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_a_client_that_does_not_read_stops_the_relay_reading_upstream(router: HttpProc, backend: HttpProc) -> None:
    """Backpressure on the direct path (the upstream connection writing each read's bytes to the
    client's transport itself): while the client reads nothing, the router stops taking the replica's
    bytes (past what the sockets between hold) instead of piling them up in its memory; once the client
    reads, every byte arrives, in order."""
    backend.reset()
    text = "".join(f"{i:07d}" for i in range(40_000_000 // 7))  # 40 MB, every position telling its place
    backend.configure(chunks=400, reply=text)  # sent at once, far more than the sockets between hold
    rss = _rss_kib(router)
    with _stream(router) as r:  # type: ignore[attr-defined]
        assert r.status_code == 200
        time.sleep(2.0)  # the client not reading (the behaviour under test): nothing read meanwhile
        grown = _rss_kib(router) - rss
        got = [json.loads(line[6:])["choices"][0]["delta"].get("content", "") for line in r.iter_lines()
               if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(got) == text
    assert grown < 16 * 1024, f"the router grew {grown} KiB holding a blocked client's stream"


def test_a_stream_that_keeps_coming_is_not_cut_by_the_stall_bound(router: HttpProc, backend: HttpProc) -> None:
    """The pool's timeout_s (0.3 s here) bounds a wait for the next byte, not the stream: chunks 0.1 s
    apart for 2 s, each written to the client from the upstream connection's callback, restart it."""
    backend.reset()
    backend.configure(chunks=20, chunk_delay_s=0.1)
    with _stream(router) as r:  # type: ignore[attr-defined]
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 21, lines[-3:]
    assert backend.stats()["disconnected"] == 0
