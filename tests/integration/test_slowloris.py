"""The header timeout and the connection limit (edge/connection_limits.py) on every HTTP server of the
fleet, real processes over raw sockets: the frontend under uvicorn, hypercorn and granian (render-only:
no engine needed), and the router. A slowloris client (header bytes sent slowly, or a request begun
and never finished, or nothing sent at all) is closed after --header-timeout while others are served;
a keep-alive connection that finished its request is not; one connection past --max-connections is
refused, never served, and a connection is served again once one closes. The same wait bounds a request's
body (slow POST): one that stops arriving, or trickles a byte at a time, is answered 408 and closed, its
connection slot freed; one that keeps coming in short gaps is served however long it takes."""
from __future__ import annotations

import importlib.util
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import HttpProc, start_frontend, start_router

HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 6
DEADLINE_S = 30.0  # what "closed" waits for at most: a server that never closes fails here
GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
SERVERS = ["uvicorn", "hypercorn",
           pytest.param("granian", marks=pytest.mark.skipif(importlib.util.find_spec("granian") is None,
                                                            reason="the granian extra is not installed")),
           "router"]


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    tmp: Path = tmp_path_factory.mktemp("slowloris")
    limits: tuple[str, ...] = ("--header-timeout", str(HEADER_TIMEOUT_S))
    if request.param != "granian":  # which cannot bound its connections: the frontend refuses the flag with it
        limits += ("--max-connections", str(MAX_CONNECTIONS))
    if request.param == "router":
        proc: HttpProc = start_router(tmp, """
listeners: [{port: {port}, host: 127.0.0.1}]
pools:
  p: {model: m, replicas: [{url: "http://127.0.0.1:9"}]}
entries:
  fleet: {default: [p]}
""", *limits)
    else:
        proc = start_frontend(tmp, "--render-only", "--http-server", request.param, *limits)
    yield proc
    proc.stop()


def connect(server: HttpProc) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S)


def closed_by_server(sock: socket.socket, *, trickle: bytes = b"") -> bytes:
    """Wait (at most DEADLINE_S) for the server to end the connection, sending `trickle` a byte at a
    time meanwhile, each after a fifth of the header timeout passes with nothing read; what the server
    sent before closing. Fails if the connection outlives the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    received = b""
    pending = trickle
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], HEADER_TIMEOUT_S / 5)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
        elif pending:
            try:
                sock.sendall(pending[:1])
            except (BrokenPipeError, ConnectionResetError):
                return received
            pending = pending[1:] or trickle  # a slowloris never runs out of header lines
    raise AssertionError(f"the server held the connection for {DEADLINE_S} s (received {received!r})")


def served(server: HttpProc) -> bool:
    return httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_connection_that_sends_nothing_is_closed(server: HttpProc) -> None:
    with connect(server) as sock:
        assert closed_by_server(sock) == b""  # nothing asked, nothing answered


def test_a_request_begun_and_never_finished_is_closed_while_others_are_served(server: HttpProc,
                                                                             request: pytest.FixtureRequest) -> None:
    socks = [connect(server) for _ in range(3)]
    try:
        for sock in socks:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        assert served(server)  # the stalled ones hold no one up
        for sock in socks:
            answer = closed_by_server(sock)
            if request.node.callspec.params["server"] == "granian":  # hyper closes without a word
                assert answer == b"", answer
            else:
                assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
                assert b'"code": 408' in answer and b"headers were not complete within 1 s" in answer
    finally:
        for sock in socks:
            sock.close()


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_timeout(server: HttpProc) -> None:
    """Each byte comes well inside the timeout: activity does not extend it, the headers' end must come."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        answer = closed_by_server(sock, trickle=b"X-Slow: abcdefgh\r\n")
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer
        assert served(server)


def _not_granian(request: pytest.FixtureRequest, why: str) -> None:
    """The intended differences of granian's frontend, each documented in docs/frontend.md."""
    if request.node.callspec.params["server"] == "granian":
        pytest.skip(f"granian: {why} (docs/frontend.md)")


def test_pipelined_requests_are_answered_and_an_unfinished_one_cut_off(server: HttpProc,
                                                                     request: pytest.FixtureRequest) -> None:
    with connect(server) as sock:
        sock.sendall(GET + GET)
        data = b""
        while data.count(b"HTTP/1.1 200 ") < 2 or not data.endswith(b"}"):  # both answers, bodies included
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.count(b"HTTP/1.1 ") == 2, data
    with connect(server) as sock:  # the second's head comes with the first, and stops short
        sock.sendall(GET + b"GET /health HTTP/1.1\r\nHost: x\r\n")
        answer = closed_by_server(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == (
            1 if request.node.callspec.params["server"] == "granian" else 2), answer
        assert answer.count(b"HTTP/1.1 408 ") == answer.count(b"HTTP/1.1 ") - 1, answer


def test_a_keep_alive_connection_outlives_the_header_timeout(server: HttpProc, request: pytest.FixtureRequest) -> None:
    _not_granian(request, "its header_read_timeout also ends a keep-alive connection idle that long")
    with connect(server) as sock:
        sock.sendall(GET)
        assert _response(sock).startswith(b"HTTP/1.1 200 ")
        # Idle past the header timeout: only the keep-alive timeout (75 s) may end it.
        readable, _, _ = select.select([sock], [], [], HEADER_TIMEOUT_S * 3)
        assert not readable, sock.recv(65536)
        sock.sendall(GET)
        assert _response(sock).startswith(b"HTTP/1.1 200 ")


def test_one_connection_past_the_limit_is_refused_then_served_once_one_closes(server: HttpProc,
                                                                             request: pytest.FixtureRequest) -> None:
    _not_granian(request, "it cannot bound its connections, and --max-connections is refused with it")
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):  # keep-alive connections, each with a request served
            sock = connect(server)
            sock.sendall(GET)
            assert _response(sock).startswith(b"HTTP/1.1 200 ")
            held.append(sock)
        with connect(server) as extra:
            try:
                extra.sendall(GET)
                readable, _, _ = select.select([extra], [], [], HEADER_TIMEOUT_S * 2)
                answer = extra.recv(65536) if readable else b"(queued)"
            except ConnectionError:
                answer = b"(reset)"
            # refused: a 503, or closed
            assert b" 200 " not in answer, answer
        held.pop().close()
        deadline = time.monotonic() + DEADLINE_S
        while not _served_raw(server):  # the server sees the close on its own time
            assert time.monotonic() < deadline, "no connection was served again after one closed"
    finally:
        for sock in held:
            sock.close()


def _response(sock: socket.socket) -> bytes:
    """One whole response (its content-length read) from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _served_raw(server: HttpProc) -> bool:
    with connect(server) as sock:
        try:
            sock.sendall(GET)
            return _response(sock).startswith(b"HTTP/1.1 200 ")
        except (AssertionError, ConnectionError):
            return False


def _post(request: pytest.FixtureRequest) -> tuple[bytes, bytes]:
    """A POST's complete head and the body it announces, which the route reads whole and answers 200 to:
    the frontend renders it (render-only), the router explains where it would go (no replica is called)."""
    router = request.node.callspec.params["server"] == "router"
    path = "/v1/router/explain" if router else "/v1/chat/completions/render"
    body = json.dumps({"model": "fleet" if router else "tiny",
                       "messages": [{"role": "user", "content": "slow " * 600}]}).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode(), body


def _error(answer: bytes) -> dict[str, object]:
    """The error object of a whole response (its body sized or chunked: the JSON object in it)."""
    body = answer.partition(b"\r\n\r\n")[2]
    error = json.loads(body[body.index(b"{"):body.rindex(b"}") + 1])["error"]
    assert isinstance(error, dict)
    return error


def test_a_body_that_stops_arriving_is_answered_408_and_closed_and_its_slot_freed(
        server: HttpProc, request: pytest.FixtureRequest) -> None:
    head, body = _post(request)
    socks: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):  # every connection this server holds
            socks.append(_held(server, head + body[:10]))  # headers complete, a few body bytes, then nothing
        for sock in socks:
            answer = closed_by_server(sock)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"connection: close" in answer.partition(b"\r\n\r\n")[0].lower(), answer
            assert _error(answer) == {"message": "the request's body stopped arriving: no bytes came for 1 s",
                                      "type": "invalid_request_error", "param": None, "code": 408}
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + DEADLINE_S
    while not _served_raw(server):  # their slots free again (the server sees the closes on its own time)
        assert time.monotonic() < deadline, "no connection was served after the stalled bodies were closed"


def _held(server: HttpProc, data: bytes) -> socket.socket:
    """A connection that sent `data` and was not refused at once: the connections an earlier test closed
    may still hold slots for a moment (the server sees a close on its own time), so a refusal is retried."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        sock = connect(server)
        sock.sendall(data)
        readable, _, _ = select.select([sock], [], [], HEADER_TIMEOUT_S / 5)
        if not readable:
            return sock
        answer = sock.recv(65536)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 503 ") and time.monotonic() < deadline, answer


def test_a_body_trickled_a_byte_at_a_time_is_cut_off(server: HttpProc, request: pytest.FixtureRequest) -> None:
    """Never a gap as long as the timeout, but a few bytes a second: the rate floor ends it (slow POST)."""
    head, body = _post(request)
    with connect(server) as sock:
        sock.sendall(head)
        answer = closed_by_server(sock, trickle=body)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert "arrived too slowly" in str(_error(answer)["message"]), answer


def test_a_body_that_keeps_coming_in_short_gaps_is_served(server: HttpProc, request: pytest.FixtureRequest) -> None:
    """Sent in pieces a quarter of the timeout apart, over several timeouts: not cut."""
    head, body = _post(request)
    with connect(server) as sock:
        sock.sendall(head)
        pieces = [body[i:i + 200] for i in range(0, len(body), 200)]
        assert len(pieces) * HEADER_TIMEOUT_S / 4 > 3 * HEADER_TIMEOUT_S
        for piece in pieces:
            readable, _, _ = select.select([sock], [], [], HEADER_TIMEOUT_S / 4)  # the gap (a stimulus)
            assert not readable, sock.recv(65536)  # no answer before the body is complete
            sock.sendall(piece)
        head_received = b""
        while b"\r\n\r\n" not in head_received:
            chunk = sock.recv(65536)
            assert chunk, head_received
            head_received += chunk
        assert head_received.startswith(b"HTTP/1.1 200 "), head_received
