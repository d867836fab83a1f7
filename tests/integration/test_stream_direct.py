"""Streams written in the engine dispatch pass (http_api/direct_stream.py) on a real frontend under
uvicorn: a keep-alive connection serves stream after stream, a client that stops reading gets every
byte once it reads again, and one that leaves mid-stream has its request aborted. Real processes: a
frontend over a sim engine, raw HTTP/1.1 clients."""
from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from tests.support.procs import FrontendProc, start_engine, start_frontend
from tests.support.waiting import until

CHAT = [{"role": "user", "content": "Stream this"}]


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    tmp = tmp_path_factory.mktemp("direct")
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "0.5")
    try:
        fe = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint())
        try:
            yield fe
        finally:
            fe.stop()
    finally:
        engine.stop()


def _request(max_tokens: int, **fields: object) -> bytes:
    body = json.dumps({"model": "tiny", "messages": CHAT, "max_tokens": max_tokens, "seed": 7, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}, **fields}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body))


class _Reader:
    """One HTTP/1.1 connection's responses, read from the socket as they come."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the server closed the connection")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def response(self) -> tuple[bytes, bytes]:
        """The head and the de-chunked body of the next response."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b"transfer-encoding: chunked" in head.lower(), head
        body = b""
        while True:
            size = int(self._line(), 16)
            while len(self.buf) < size + 2:
                self._fill()
            body, self.buf = body + self.buf[:size], self.buf[size + 2:]
            if size == 0:
                return head, body


def _content(body: bytes) -> tuple[str, int]:
    """The streamed text and the usage's completion tokens; the stream must end with [DONE]."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    text, tokens = "", 0
    for event in body.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        chunk = json.loads(event[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
    return text, tokens


def _whole(frontend: FrontendProc, max_tokens: int) -> str:
    with openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        answer = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                seed=7, extra_body={"ignore_eos": True})
    return answer.choices[0].message.content or ""


def _metric(frontend: FrontendProc, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(frontend.url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_keep_alive_connection_serves_stream_after_stream(frontend: FrontendProc) -> None:
    whole = _whole(frontend, 40)
    with socket.create_connection(("127.0.0.1", frontend.port), timeout=60) as sock:
        reader = _Reader(sock)
        for _ in range(3):
            sock.sendall(_request(40))
            head, body = reader.response()
            assert head.startswith(b"HTTP/1.1 200")
            assert _content(body) == (whole, 40)
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")  # and a plain route after them
        data = b""
        while b'"object":"list"' not in data:
            data += sock.recv(65536)


def test_a_client_that_stops_reading_gets_every_byte_when_it_reads_again(frontend: FrontendProc) -> None:
    tokens = 3000  # ~6 MB with twenty alternatives a token: past the kernel's buffers (4 MB to send here)
    whole = _whole(frontend, tokens)
    done_before = _metric(frontend, "vllm:request_success_total", 'finished_reason="length"')
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(120)
    sock.connect(("127.0.0.1", frontend.port))
    with sock:
        sock.sendall(_request(tokens, logprobs=True, top_logprobs=20))
        # The engine finishes (0.5 ms a token) while nothing is read: the frontend holds the rest, the
        # response unfinished.
        until("the request to reach the engine",
              lambda: True if _metric(frontend, "fleet:engine_streams_open") == 1 else None)
        until("the engine to finish the request",
              lambda: True if _metric(frontend, "fleet:engine_streams_open") == 0 else None, timeout_s=120)
        assert _metric(frontend, "vllm:request_success_total", 'finished_reason="length"') == done_before
        head, body = _Reader(sock).response()
    assert head.startswith(b"HTTP/1.1 200") and len(body) > 5_000_000, len(body)
    assert _content(body) == (whole, tokens)
    assert body.count(b'"top_logprobs":[') >= tokens - 10  # a token ending inside a character shares an event
    until("the request to be counted done", lambda: True if _metric(
        frontend, "vllm:request_success_total", 'finished_reason="length"') == done_before + 1 else None)


def test_a_client_that_leaves_mid_stream_has_its_request_aborted(frontend: FrontendProc) -> None:
    aborted = _metric(frontend, "vllm:request_success_total", 'finished_reason="abort"')
    with socket.create_connection(("127.0.0.1", frontend.port), timeout=60) as sock:
        sock.sendall(_request(4000))
        reader = _Reader(sock)
        while reader.buf.count(b"data: ") < 20:  # tokens are streaming
            reader._fill()
    until("the request to be aborted", lambda: True if _metric(
        frontend, "vllm:request_success_total", 'finished_reason="abort"') == aborted + 1 else None)
    until("the engine stream to close", lambda: True if _metric(frontend, "fleet:engine_streams_open") == 0 else None)
