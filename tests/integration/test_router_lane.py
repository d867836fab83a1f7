"""The router's lane (listeners/lane.py): a plain streamed request relayed in the connections' callbacks,
with the ASGI path's answer. A router process in front of test backend processes; raw sockets as clients,
so that a test says whether a request's body comes whole with its head (the lane's) or after it (then the
ASGI path reads it: the same request by the other way, to compare)."""
from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.procs import HttpProc, start_backend, start_router
from tests.support.waiting import until

BODY = json.dumps({"model": "fleet", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HttpProc]]:
    tmp = tmp_path_factory.mktemp("lane")
    procs = [start_backend(tmp, "a"), start_backend(tmp, "b")]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, backends: list[HttpProc]) -> Iterator[HttpProc]:
    a, b = backends
    proc = start_router(tmp_path_factory.mktemp("lane-router"), f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: m, replicas: [{{url: "{a.url}"}}, {{url: "{b.url}"}}], timeout_s: 5}}
entries:
  fleet: {{default: [p]}}
""")
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def fresh(backends: list[HttpProc]) -> None:
    for backend in backends:
        backend.reset()


def _one_replica(tmp_path: Path, name: str, *args: str) -> tuple[HttpProc, HttpProc]:
    """A test backend named `name`, and a router (started with `args`) whose one pool is it alone."""
    backend = start_backend(tmp_path, name)
    router = start_router(tmp_path, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: m, replicas: [{{url: "{backend.url}"}}]}}
entries:
  fleet: {{default: [p]}}
""", *args)
    return backend, router


def _request(body: bytes = BODY, path: str = "/v1/chat/completions") -> tuple[bytes, bytes]:
    head = (f"POST {path} HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    return head, body


def _read_response(sock: socket.socket, buffered: bytearray) -> tuple[bytes, bytes]:
    """One response off `sock` (with what was read past the one before in `buffered`): its head, and
    its body de-chunked (or by content-length)."""
    while b"\r\n\r\n" not in buffered:
        buffered += _recv(sock)
    end = buffered.index(b"\r\n\r\n") + 4
    head = bytes(buffered[:end])
    del buffered[:end]
    body = bytearray()
    if b"transfer-encoding: chunked" in head.lower():
        while True:
            while b"\r\n" not in buffered:
                buffered += _recv(sock)
            line_end = buffered.index(b"\r\n")
            size = int(buffered[:line_end], 16)
            while len(buffered) < line_end + 2 + size + 2:
                buffered += _recv(sock)
            body += buffered[line_end + 2:line_end + 2 + size]
            del buffered[:line_end + 2 + size + 2]
            if size == 0:
                return head, bytes(body)
    length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
    while len(buffered) < length:
        buffered += _recv(sock)
    body += buffered[:length]
    del buffered[:length]
    return head, bytes(body)


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("the router closed the connection")
    return data


@contextmanager
def _lane_stream(router: HttpProc, backend: HttpProc, chunks: int,
                 delay_s: float) -> Iterator[tuple[socket.socket, bytearray]]:
    """A streamed request under way by the lane (the upstream connection opened first by a request of its own),
    the replica pacing `chunks` chunks `delay_s` apart: its connection and what came so far, the head in it."""
    _whole(router)  # the upstream connection open: the next request is the lane's
    backend.configure(chunks=chunks, chunk_delay_s=delay_s)
    with _connect(router) as sock:
        head, body = _request()
        sock.sendall(head + body)
        buffered = bytearray(_recv(sock))
        assert buffered.startswith(b"HTTP/1.1 200 OK\r\n")
        yield sock, buffered


def _connect(router: HttpProc) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _whole(router: HttpProc, body: bytes = BODY, path: str = "/v1/chat/completions") -> tuple[bytes, bytes]:
    """A request sent in one write (head and body together: the lane may take it)."""
    with _connect(router) as sock:
        head, data = _request(body, path)
        sock.sendall(head + data)
        return _read_response(sock, bytearray())


def _split(router: HttpProc, body: bytes = BODY, path: str = "/v1/chat/completions") -> tuple[bytes, bytes]:
    """The same request with its body sent after its head, in a later read: the ASGI path's."""
    with _connect(router) as sock:
        head, data = _request(body, path)
        sock.sendall(head)
        time.sleep(0.05)
        sock.sendall(data)
        return _read_response(sock, bytearray())


def _lane(router: HttpProc) -> dict[str, float]:
    text = httpx.get(router.url + "/metrics", timeout=10).text
    found = re.finditer(r'router_lane_total\{[^}]*outcome="(\w+)"\} (\S+)', text)
    return {m.group(1): float(m.group(2)) for m in found}


def _status_count(router: HttpProc, status: str) -> float:
    text = httpx.get(router.url + "/metrics", timeout=10).text
    found = re.search(r'router_requests_total\{api="chat",listener="[^"]*",status="' + status + r'"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def _warm(router: HttpProc) -> None:
    """Both replicas' upstream connections open and idle in the router (each a lane request then)."""
    for _ in range(4):
        _whole(router)


def _heads_alike(head: bytes) -> list[bytes]:
    """A response head's lines but for its date (a second may turn between two answers)."""
    return sorted(line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"date:"))


def _events(body: bytes) -> list[dict[str, object] | str]:
    """An SSE body's events, each chunk's `id` and `created` left out (the backend makes them anew)."""
    out: list[dict[str, object] | str] = []
    for line in body.decode().split("\n"):
        if line.startswith("data: "):
            data = line[6:]
            if data == "[DONE]":
                out.append(data)
                continue
            event = json.loads(data)
            event.pop("id", None)
            event.pop("created", None)
            out.append(event)
    return out


def test_the_lane_answers_as_the_asgi_path_does(router: HttpProc, backends: list[HttpProc]) -> None:
    _warm(router)
    for backend in backends:  # the replica alternates: both answer alike
        backend.configure(reply="the same words from either", chunks=4)
    before = _lane(router).get("streamed", 0)
    lane_head, lane_body = _whole(router)
    after = _lane(router).get("streamed", 0)
    assert after == before + 1  # this one went by the lane
    asgi_head, asgi_body = _split(router)
    assert _lane(router).get("streamed", 0) == after  # and this one did not
    assert lane_head.startswith(b"HTTP/1.1 200 OK\r\n")
    replica = re.search(rb"x-router-replica: (\S+)", lane_head).group(1)  # type: ignore[union-attr]
    # The replica alternates (least recently assigned first): compare heads with it taken out.
    assert _heads_alike(lane_head.replace(replica, b"R")) == _heads_alike(
        asgi_head.replace(re.search(rb"x-router-replica: (\S+)", asgi_head).group(1), b"R"))  # type: ignore[union-attr]
    assert b"x-router-attempts: 1\r\n" in lane_head and b"x-router-entry: fleet\r\n" in lane_head
    assert _events(lane_body) == _events(asgi_body) and _events(lane_body)[-1] == "[DONE]"


def test_lane_requests_keep_the_connection_and_pipelined_ones_answer_in_order(
        router: HttpProc, backends: list[HttpProc]) -> None:
    _warm(router)
    for backend in backends:
        backend.configure(chunks=5, chunk_delay_s=0.01)
    bodies = [json.dumps({"model": "fleet", "stream": True,
                          "messages": [{"role": "user", "content": f"question {i}"}]}).encode() for i in range(3)]
    with _connect(router) as sock:
        buffered = bytearray()
        # Two requests in one write: the second waits for the first's answer, as uvicorn pipelines.
        sock.sendall(b"".join(head + body for head, body in map(_request, bodies[:2])))
        answers = [_read_response(sock, buffered) for _ in range(2)]
        head, body = _request(bodies[2])
        sock.sendall(head + body)  # and the same connection serves a third
        answers.append(_read_response(sock, buffered))
    for i, (head, body) in enumerate(answers):
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        events = _events(body)
        assert events[-1] == "[DONE]" and len(events) == 6, (i, events)
    seen = [p for backend in backends for p in backend.stats()["prompts"] if p.startswith("question")]
    assert sorted(seen) == [f"question {i}" for i in range(3)]


def test_a_refusal_to_a_lane_request_is_retried_on_the_other_replica(
        router: HttpProc, backends: list[HttpProc]) -> None:
    _warm(router)
    a, b = backends
    a.configure(status=503)
    b.configure(status=503)
    handed = _lane(router).get("handed", 0)
    head, body = _whole(router)  # the lane sends it to one replica; both refuse: the ASGI path's 503
    assert head.startswith(b"HTTP/1.1 502") or head.startswith(b"HTTP/1.1 503"), head
    assert json.loads(body)["error"]["message"]
    assert _lane(router).get("handed", 0) == handed + 1
    b.configure(status=200)
    for _ in range(2):  # whichever replica the lane picks first, b answers it
        head, body = _whole(router)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        assert re.search(rb"x-router-replica: (\S+)", head).group(1).decode() == b.url  # type: ignore[union-attr]
        assert _events(body)[-1] == "[DONE]"
    assert b"x-router-attempts: 2\r\n" in head or b"x-router-attempts: 1\r\n" in head


def test_an_upstream_client_error_reaches_the_client_as_the_asgi_path_answers_it(
        router: HttpProc, backends: list[HttpProc]) -> None:
    _warm(router)
    for backend in backends:
        backend.configure(status=400)
    lane_head, lane_body = _whole(router)
    asgi_head, asgi_body = _split(router)
    assert lane_head.startswith(b"HTTP/1.1 400") and asgi_head.startswith(b"HTTP/1.1 400")
    lane_error, asgi_error = json.loads(lane_body)["error"], json.loads(asgi_body)["error"]
    for error in (lane_error, asgi_error):  # the replica alternates: its name is in the message
        error["message"] = re.sub(r"^[ab] ", "", error["message"])
    assert lane_error == asgi_error and lane_error["message"] == "is told to fail"


def test_a_client_leaving_a_lane_stream_ends_it_upstream(router: HttpProc, backends: list[HttpProc]) -> None:
    _warm(router)
    for backend in backends:
        backend.configure(chunks=100, chunk_delay_s=0.05)
    gone = _status_count(router, "499")
    streamed = _lane(router).get("streamed", 0)
    with _connect(router) as sock:
        head, body = _request()
        sock.sendall(head + body)
        got = _recv(sock)
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert _lane(router).get("streamed", 0) == streamed + 1
    until("the backend saw the stream closed", lambda: True if sum(
        b.stats()["disconnected"] for b in backends) == 1 else None, timeout_s=10)
    until("the router counted a 499", lambda: True if _status_count(router, "499") == gone + 1 else None,
          timeout_s=10)
    for backend in backends:
        backend.configure(chunks=3, chunk_delay_s=0.0)
    assert _events(_whole(router)[1])[-1] == "[DONE]"  # and the next request is served


def test_a_lane_stream_broken_off_upstream_ends_with_the_error_event(tmp_path: Path) -> None:
    doomed, router = _one_replica(tmp_path, "doomed")
    try:
        streamed = _lane(router).get("streamed", 0)
        with _lane_stream(router, doomed, 50, 0.05) as (sock, buffered):
            doomed.proc.kill()
            _, data = _read_response(sock, buffered)
        events = _events(data)
        assert events[-1] != "[DONE]" and "upstream failed mid-stream" in json.dumps(events[-1])
        assert _lane(router).get("streamed", 0) == streamed + 1
    finally:
        router.stop()
        doomed.stop()


def test_a_body_too_long_for_the_loop_and_a_non_streamed_request_take_the_asgi_path(router: HttpProc) -> None:
    _warm(router)
    lane = _lane(router)
    whole = json.dumps({"model": "fleet", "messages": [{"role": "user", "content": "x"}]}).encode()
    head, body = _whole(router, whole)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and json.loads(body)["choices"]
    long = json.dumps({"model": "fleet", "stream": True,
                       "messages": [{"role": "user", "content": "y" * (300 << 10)}]}).encode()
    head, body = _whole(router, long)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and _events(body)[-1] == "[DONE]"
    head, body = _whole(router, BODY.replace(b'"fleet"', b'"nope"'))
    assert head.startswith(b"HTTP/1.1 404") and "nope" in json.loads(body)["error"]["message"]
    assert _lane(router) == lane  # none of them was the lane's


def test_a_clients_traceparent_reaches_the_replica_by_the_lane_and_by_a_hand_over(tmp_path: Path) -> None:
    """Tracing off in the router: a client's trace context still goes on to the replica (as the ASGI path
    passes it), whether the lane sends the request itself or hands it over (no idle connection yet)."""
    backend, router = _one_replica(tmp_path, "t")
    try:
        parents = [f"00-{i:032x}-{i:016x}-01" for i in (1, 2)]
        for parent in parents:  # the first is handed over (no connection yet), the second the lane's own
            with _connect(router) as sock:
                head, body = _request()
                sock.sendall(head.replace(b"\r\n\r\n", f"\r\ntraceparent: {parent}\r\n\r\n".encode()) + body)
                got_head, got = _read_response(sock, bytearray())
            assert got_head.startswith(b"HTTP/1.1 200 OK\r\n") and _events(got)[-1] == "[DONE]"
        assert _lane(router) == {"handed": 1.0, "streamed": 1.0}
        assert backend.stats()["traceparents"] == parents
    finally:
        router.stop()
        backend.stop()


def test_a_lane_stream_in_flight_ends_whole_when_the_router_stops(tmp_path: Path) -> None:
    """SIGTERM while a lane stream of 7.5 s runs (longer than uvicorn's default 5 s of grace): the default
    --shutdown-timeout (30 s, the frontend's) lets it finish (it is no task of uvicorn's, so the connection's
    open response is what it waits on), no new connection is taken meanwhile, the stream ends with [DONE],
    and the connection closes after it instead of staying kept alive."""
    backend, router = _one_replica(tmp_path, "s")
    try:
        with _lane_stream(router, backend, 30, 0.25) as (sock, buffered):
            router.proc.terminate()
            # The listener is closed at once; the stream runs on.
            until("the listener closed", lambda: not _accepts(router.port) or None, timeout_s=5, every_s=0.05)
            _, data = _read_response(sock, buffered)
            assert _events(data)[-1] == "[DONE]" and len(_events(data)) == 31
            sock.settimeout(2.0)
            assert sock.recv(1) == b""  # closed after the stream, not kept alive
        assert router.proc.wait(timeout=10) == 0
    finally:
        router.stop()
        backend.stop()


def test_a_stream_running_past_the_shutdown_timeout_is_cut_and_the_router_exits(tmp_path: Path) -> None:
    """--shutdown-timeout 1: a lane stream of 10 s in flight at SIGTERM is cut about a second later (no
    [DONE]) and the router exits 0 then, not when the stream would have ended."""
    backend, router = _one_replica(tmp_path, "s", "--shutdown-timeout", "1")
    try:
        with _lane_stream(router, backend, 40, 0.25) as (sock, buffered):
            router.proc.terminate()
            sock.settimeout(8.0)
            while chunk := sock.recv(65536):  # until the router closes it
                buffered += chunk
            assert router.proc.wait(timeout=5) == 0
            assert 0 < buffered.count(b"data: {") < 40 and b"[DONE]" not in buffered
            assert b"error" not in buffered  # cut, with no error tail (docs/router.md)
    finally:
        router.stop()
        backend.stop()


def test_an_asgi_stream_running_past_the_shutdown_timeout_is_cut_without_a_traceback(tmp_path: Path) -> None:
    """The ASGI path's stream (Anthropic Messages, adapted: not the lane's) in flight at SIGTERM with
    --shutdown-timeout 1: its task is cancelled at the deadline, the router exits 0, and its log says how many
    were cut in one line, with no "Exception in ASGI application" traceback for the cancellation."""
    backend, router = _one_replica(tmp_path, "s", "--shutdown-timeout", "1")
    try:
        backend.configure(chunks=40, chunk_delay_s=0.25)
        with httpx.stream("POST", router.url + "/v1/messages", timeout=30,
                          json={"model": "fleet", "max_tokens": 50, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines) == "event: message_start"
            router.proc.terminate()
            with pytest.raises(httpx.RemoteProtocolError):  # cut: the chunked body never ends
                for line in lines:
                    assert "message_stop" not in line
        assert router.proc.wait(timeout=10) == 0
        log = router.log()
        assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in log
        assert "Exception in ASGI application" not in log and "CancelledError" not in log
    finally:
        router.stop()
        backend.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_pipelined_request_does_not_stall_a_lane_stream_waiting_on_a_slow_client(
        router: HttpProc, backends: list[HttpProc]) -> None:
    """A lane stream paused on a full client transport is resumed when it drains, though a pipelined
    request's cycle has replaced its own on the connection meanwhile; then the pipelined one is answered."""
    _warm(router)
    text = "".join(f"{i:07d}" for i in range(16_000_000 // 7))  # 16 MB: more than the sockets between hold
    for backend in backends:
        backend.configure(chunks=200, reply=text)
    with _connect(router) as sock:
        sock.settimeout(30)
        sock.sendall(b"".join(head + body for head, body in (_request(), _request())))
        time.sleep(1.0)  # the slow client itself: nothing read meanwhile, the router's writes back up
        buffered = bytearray()
        answers = [_read_response(sock, buffered) for _ in range(2)]
    for head, body in answers:
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        events = _events(body)
        assert events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == text  # type: ignore[index]


def test_a_client_leaving_before_the_head_is_seen_though_its_body_was_long(
        router: HttpProc, backends: list[HttpProc]) -> None:
    """A body past uvicorn's 64 KiB high-water mark pauses reading until the request reads it; the lane has
    it whole, and reads on: a client leaving while the replica has not answered yet is seen at once."""
    _warm(router)
    for backend in backends:
        backend.configure(delay_s=4.0)
    gone = _status_count(router, "499")
    long = json.dumps({"model": "fleet", "stream": True,
                       "messages": [{"role": "user", "content": "z" * (100 << 10)}]}).encode()
    with _connect(router) as sock:
        head, body = _request(long)
        sock.sendall(head + body)
        time.sleep(0.3)
    until("the router counted the 499 before the replica answered", lambda: True if _status_count(
        router, "499") == gone + 1 else None, timeout_s=2.5)


def test_a_pipelined_request_whose_body_stalls_gets_the_body_timeout(tmp_path: Path) -> None:
    backend, router = _one_replica(tmp_path, "p", "--header-timeout", "1")
    try:
        _whole(router)  # the upstream connection open: the first request below is the lane's
        backend.configure(chunks=5, chunk_delay_s=0.1)
        with _connect(router) as sock:
            head, body = _request()
            # A whole request, then another's head and a part of its body, never finished.
            sock.sendall(head + body + head + body[:10])
            buffered = bytearray()
            first_head, first = _read_response(sock, buffered)
            assert first_head.startswith(b"HTTP/1.1 200 OK\r\n") and _events(first)[-1] == "[DONE]"
            started = time.monotonic()
            second_head, _ = _read_response(sock, buffered)
            assert second_head.startswith(b"HTTP/1.1 408"), second_head
            assert time.monotonic() - started < 5
    finally:
        router.stop()
        backend.stop()
