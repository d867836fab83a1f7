"""The floors bench/router_latency.py holds the router against, each in its own process on a real socket in
front of the test backend: the byte pipe (`--floor`), the byte pipe in C (`--c-floor`, bench/relay_floor.c
built with cc), the least HTTP router (`--http-floor`, bench/router_floor.py) and the same doing the router's
own parts (`--decide-floor`, router_floor.py --decide, its entry named as the model). A floor's figure means
something only if it does the relay's whole work: every byte both ways, streams and long bodies, keep-alive,
a client that leaves mid-stream, a client that reads slowly (its bytes parked, none lost)."""
from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import openai
import pytest

from tests.support.procs import HttpProc, start_backend

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
REPLY = "one two three four five six seven"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    proc = start_backend(tmp_path_factory.mktemp("floors"), "up")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module", params=["pipe", "cpipe", "least", "decide"])
def floor(request: pytest.FixtureRequest, backend: HttpProc,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    config = (f'listeners: [{{port: {{port}}, host: 127.0.0.1}}]\n'
              f'pools: {{p: {{model: tiny, replicas: [{{url: "{backend.url}"}}]}}}}\n'
              f'entries: {{tiny: {{default: [p]}}}}\n')
    proc = _router_latency().start_floor(tmp_path_factory.mktemp(request.param), request.param, backend.port,
                                         config)
    try:
        yield proc
    finally:
        proc.stop()


def _router_latency() -> ModuleType:
    """bench/router_latency.py, which starts each floor as the bench runs it (bench/ on the path only while it
    imports: its modules are scripts, found beside each other)."""
    sys.path.append(str(BENCH))
    try:
        import router_latency
    finally:
        sys.path.remove(str(BENCH))
    return router_latency


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_streams_and_whole_answers_pass_through_on_one_connection(backend: HttpProc, floor: HttpProc) -> None:
    backend.configure(reply=REPLY, chunks=7, chunk_delay_s=0.005)
    with _client(floor.url) as client:
        for _ in range(3):  # one kept-alive connection: each floor reuses its upstream one
            stream = client.chat.completions.create(model="tiny", stream=True,
                                                    messages=[{"role": "user", "content": "hi"}])
            chunks = list(stream)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
            whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
            assert whole.choices[0].message.content == REPLY


def test_a_client_leaving_mid_stream_leaves_the_floor_serving(backend: HttpProc, floor: HttpProc) -> None:
    backend.configure(reply=REPLY, chunks=7, chunk_delay_s=0.05)
    with _client(floor.url) as client:
        stream = client.chat.completions.create(model="tiny", stream=True, messages=[{"role": "user", "content": "hi"}])
        next(iter(stream))
        stream.close()  # the connection dropped with the answer under way
    backend.configure(chunk_delay_s=0.0)
    with _client(floor.url) as client:
        whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert whole.choices[0].message.content == REPLY
    assert floor.proc.poll() is None


def test_a_slow_reader_gets_every_byte_of_a_long_answer(backend: HttpProc, floor: HttpProc) -> None:
    reply = "0123456789" * 800_000  # 8 MB: more than the sockets hold, so the floor parks bytes and waits
    backend.configure(reply=reply, chunks=1, chunk_delay_s=0.0)
    body = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
    with socket.create_connection(("127.0.0.1", floor.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%b" % (len(body), body))
        time.sleep(1.0)  # nothing read meanwhile: the floor's writes to this client block
        got = bytearray()
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        head, _, rest = bytes(got).partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        received = bytearray(rest)
        if b"transfer-encoding: chunked" in lines:
            while not received.endswith(b"\r\n0\r\n\r\n"):
                data = sock.recv(1 << 20)
                assert data, f"the floor closed after {len(received)} bytes of a chunked body"
                received += data
            body = _unchunked(bytes(received))
        else:
            length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:"))
            while len(received) < length:
                data = sock.recv(1 << 20)
                assert data, f"the floor closed after {len(received)} of {length} bytes"
                received += data
            body = bytes(received)
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["choices"][0]["message"]["content"] == reply


def _unchunked(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        at = end + 2 + size + 2
