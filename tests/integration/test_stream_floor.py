"""The reference servers of bench/stream_floor.py, each in its own process on a real socket: the bytes of
a stream (the fleet's chunk shapes, HTTP/1.1 chunked framing), keep-alive and pipelining on one
connection, a refused request, and the official SDK reading a stream."""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import openai
import pytest

from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "stream_floor.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(base: str) -> bool | None:
    try:
        with urllib.request.urlopen(base + "/ready", timeout=1) as resp:
            return resp.status == 200 or None
    except OSError:
        return None


@pytest.fixture(scope="module", params=["onepass", "asgi"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--kind", request.param, "--port", str(port),
                             "--decode-ms", "1"], cwd=ROOT)

    def ready() -> bool | None:
        if proc.poll() is not None:
            pytest.fail(f"the {request.param} reference server exited {proc.returncode}")
        return _ready(f"http://127.0.0.1:{port}")

    try:
        until(f"the {request.param} reference server ready", ready, timeout_s=20)
        yield request.param, port
    finally:
        proc.terminate()
        proc.wait(10)


def _request(body: dict[str, Any], *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + (b"connection: close\r\n" if close else b"") + b"content-length: %d\r\n\r\n" % len(data) + data)


def _response(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response read off the connection: status, headers, the body with chunking undone."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, reader.read(int(headers["content-length"]))
    assert headers.get("transfer-encoding") == "chunked", headers
    body = b""
    while size := int(reader.readline().strip(), 16):
        body += reader.read(size)
        assert reader.read(2) == b"\r\n", "a chunk's data is followed by CRLF"
    assert reader.read(2) == b"\r\n", "the last chunk is followed by an empty trailer"
    return status, headers, body


def _events(body: bytes) -> list[Any]:
    assert body.endswith(b"\n\n")
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), events
    assert events[-1] == b"data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


def _check_stream(events: list[Any], tokens: int, top_logprobs: int | None, usage: bool) -> None:
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({e["id"] for e in events}) == 1 and events[0]["object"] == "chat.completion.chunk"
    content = events[1:1 + tokens]
    assert all(e["choices"][0]["delta"]["content"] for e in content)
    for e in content:
        logprobs = e["choices"][0]["logprobs"]
        if top_logprobs is None:
            assert logprobs is None
        else:
            entry = logprobs["content"][0]
            assert len(entry["top_logprobs"]) == top_logprobs
            assert bytes(entry["bytes"]).decode() == e["choices"][0]["delta"]["content"] == entry["token"]
    finish = events[1 + tokens]
    assert finish["choices"][0]["finish_reason"] == "length"
    rest = events[2 + tokens:]
    assert rest == ([] if not usage else [{**finish, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}}])


def test_streams_on_one_kept_alive_connection(server: tuple[str, int]) -> None:
    _, port = server
    plain = {"model": "tiny", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    top5 = {"model": "tiny", "max_tokens": 3, "stream": True, "logprobs": True, "top_logprobs": 5}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, sock.makefile("rb") as reader:
        sock.sendall(_request(plain))
        status, headers, body = _response(reader)
        assert status == 200 and headers["content-type"] == "text/event-stream"
        _check_stream(_events(body), 5, None, usage=True)
        # The same connection again: two requests pipelined in one write, answered in order; the last asks
        # for the connection to close.
        sock.sendall(_request(top5) + _request(plain, close=True))
        status, _, body = _response(reader)
        assert status == 200
        _check_stream(_events(body), 3, 5, usage=False)
        status, headers, body = _response(reader)
        assert status == 200 and headers.get("connection") == "close"
        _check_stream(_events(body), 5, None, usage=True)
        assert reader.read() == b"", "closed after the response that asked for it"


def test_a_bad_request_names_the_field(server: tuple[str, int]) -> None:
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, sock.makefile("rb") as reader:
        sock.sendall(_request({"model": "tiny", "max_tokens": 0, "stream": True}))
        status, _, body = _response(reader)
        assert status == 400 and "max_tokens" in json.loads(body)["error"]["message"]


def test_the_sdk_reads_a_stream(server: tuple[str, int]) -> None:
    _, port = server
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 4
    assert chunks[-1].choices[0].finish_reason == "length"
    client.close()


def test_the_module_is_importable_and_checks_its_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("stream_floor", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "stream_floor", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match="top_logprobs: an integer in 0..20"):
        module.StreamRequest.parse(b'{"stream": true, "logprobs": true, "top_logprobs": 21}')
    with pytest.raises(ValueError, match="kind: one of asgi, onepass"):
        module.serve("h11", "127.0.0.1", 0, 20.0)
