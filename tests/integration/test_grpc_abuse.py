"""The frontend's gRPC port (services/frontend/grpc_api/grpc_port.py, native_call.py) against hostile or odd
clients on the wire (tests/support/h2_client.py): one sim rank, a frontend with --grpc-port, --api-key and a
256 KiB --max-body-bytes. Each test is one abuse, then a check that the port still serves and holds nothing."""
from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h2.events
import h2.settings
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from protocol.grpc import pb2
from tests.integration.conftest import SIM
from tests.support import grpc_fleet
from tests.support.h2_client import GRPC_HEADERS, H2Client, connections, grpc_frame
from tests.support.waiting import until

KEY = "abuse-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
HEADERS = (*GRPC_HEADERS, *AUTH)
LIMIT = 256 * 1024  # --max-body-bytes
GENERATE = "/fleet.v1.Inference/Generate"
REQUEST = pb2.GenerateRequest(token_ids=list(range(100, 140)),
                              sampling_params=pb2.SamplingParams(max_tokens=4, temperature=0.0)).SerializeToString()

Raw = Callable[..., H2Client]


class Fleet(grpc_fleet.Fleet):
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.control.GetLoads(pb2.GetLoadsRequest(), metadata=AUTH, timeout=10).ranks)

    def memory_mib(self, field: str) -> int:
        """The frontend process's VmRSS or VmHWM (peak RSS), in MiB (API server 0 serves the gRPC port)."""
        for line in Path(f"/proc/{self.frontend.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
        raise AssertionError(f"no {field} in /proc/{self.frontend.proc.pid}/status")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with grpc_fleet.running(tmp_path_factory.mktemp("grpc-abuse"), [*SIM, "--sim-decode-ms", "1"],
                            ["--api-key", KEY, "--max-body-bytes", str(LIMIT)], make=Fleet) as f:
        yield f


@pytest.fixture
def raw(fleet: Fleet) -> Iterator[Raw]:
    """Raw HTTP/2 connections to the gRPC port, each closed after the test whatever happened."""
    with connections(fleet.grpc_port) as connect:
        yield connect


def _still_serves(fleet: Fleet, c: H2Client) -> None:
    """A normal Generate on the same connection answers OK, and nothing is left in flight."""
    sid = c.request(GENERATE, grpc_frame(REQUEST), headers=HEADERS)
    c.wait("a normal call after the abuse", lambda: c.streams[sid].closed)
    assert c.streams[sid].status.get("grpc-status") == "0", c.streams[sid].status
    until("nothing in flight", lambda: True if fleet.in_flight() == 0 else None, 10, 0.05)


def test_a_body_past_the_limit_behind_a_small_length_prefix_is_refused_before_it_ends(fleet: Fleet, raw: Raw) -> None:
    """The length prefix says 10 bytes; the client then sends 4x --max-body-bytes and never ends the stream.
    NativeCall.on_data checks only the first prefix and appends every DATA frame to the body (each one
    acknowledged at once), so the port buffers whatever the client sends, without bound, until END_STREAM.
    Held now: once the body is past one message of the limit (5 + LIMIT bytes) the call ends with an error
    (RESOURCE_EXHAUSTED or INTERNAL) and the bytes are dropped. Before the fix: no answer, the body kept."""
    c = raw()
    sid = c.request(GENERATE, struct.pack(">BI", 0, 10) + b"\0" * (4 * LIMIT), headers=HEADERS, end=False)
    c.wait("the call refused while the client still sends", lambda: c.streams[sid].closed, 3)
    assert c.streams[sid].status.get("grpc-status") in ("8", "13"), c.streams[sid].status
    _still_serves(fleet, c)


def test_a_compressed_request_is_not_decompressed_past_the_message_limit(fleet: Fleet, raw: Raw) -> None:
    """A gzip "bomb": 250 MiB of zeros compress to ~250 KiB, under the 256 KiB limit. NativeCall._message
    runs gzip.decompress on the whole message and only then compares its size with the limit, so one small
    request makes the frontend allocate 250 MiB (and a few such at once, gigabytes). grpc's own server
    stops decompressing at the receive limit. Held now: RESOURCE_EXHAUSTED and the frontend's peak RSS
    (VmHWM) grows by far less than the bomb. Before the fix: it grows by ~250 MiB or more."""
    bomb = gzip.compress(b"\0" * (250 << 20))
    assert len(bomb) < LIMIT
    peak = fleet.memory_mib("VmHWM")
    c = raw()
    sid = c.request(GENERATE, grpc_frame(bomb, compressed=True), headers=(*HEADERS, ("grpc-encoding", "gzip")))
    c.wait("the bomb refused", lambda: c.streams[sid].closed, 20)
    assert c.streams[sid].status.get("grpc-status") == "8", c.streams[sid].status
    grew = fleet.memory_mib("VmHWM") - peak
    assert grew < 64, f"the frontend's peak RSS grew {grew} MiB for a {len(bomb)}-byte request"
    _still_serves(fleet, c)


def test_a_relayed_stream_to_a_client_that_never_reads_is_held_to_its_windows(fleet: Fleet, raw: Raw) -> None:
    """A client grants the largest windows HTTP/2 allows, asks server reflection (relayed to grpc.aio) for
    fleet.proto's descriptor 100,000 times on one stream (~25 bytes a request, ~6.7 KB an answer), and never
    reads a byte. Relayed.flush_down writes grpc.aio's answers to the client's transport whenever the
    client's windows allow, ignoring Connection.paused (the transport's buffer is full), and acknowledges
    them to grpc.aio at once, so grpc.aio never stops: the frontend buffers every answer, ~25 MB a second
    without bound. Held now: the relay stops taking grpc.aio's bytes while the transport is paused (grpc.aio's
    own windows then hold it), the frontend's RSS grows by less than 48 MiB. Before the fix: it grew past 96 MiB
    in seconds and kept going."""
    c = raw(auto_ack=False)
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    c.conn.increment_flow_control_window(2**31 - 1 - 65_535)
    c.flush()
    ask = grpc_frame(reflection_pb2.ServerReflectionRequest(file_containing_symbol="fleet.v1.Inference")
                     .SerializeToString())
    before = fleet.memory_mib("VmRSS")
    sid = c.request("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", headers=HEADERS, end=False)
    c.send(sid, ask * 100_000)  # ~2.4 MB: inside the port's 4 MiB stream window, so it never blocks
    grew = 0
    # Watched for a bounded while: a relay held to its windows stops growing at once, so this cannot
    # pass by being slow; it can only fail sooner or later.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline and grew < 48:
        time.sleep(0.2)
        now = fleet.memory_mib("VmRSS")
        before = min(before, now)  # an earlier test's garbage may still be going back to the OS
        grew = now - before
    assert grew < 48, f"the frontend's RSS grew {grew} MiB for a client that never reads"
    c.close()
    until("the relayed stream gone", lambda: True if fleet.in_flight() == 0 else None, 10, 0.05)



@pytest.mark.parametrize("kind", [0x0, 0x7], ids=["data", "goaway"])
def test_a_frame_head_past_the_max_frame_size_closes_the_connection_at_once(fleet: Fleet, raw: Raw, kind: int) -> None:
    """A frame head (DATA, or GOAWAY) claiming 16 MiB of payload; the port's SETTINGS_MAX_FRAME_SIZE is 1 MiB.
    h2 (4.4) checks a frame's length only once the whole frame is buffered, and GoawayFilter holds a GOAWAY's
    bytes until all of it is here (re-joined, `self._held + data`, on every read), so each connection can
    make the port hold 16 MiB of junk, every frame behind it (here a PING) swallowed meanwhile. The filter
    already reads every frame head. Held now: FRAME_SIZE_ERROR and the connection closed as soon as the
    head is read. Before the fix: it stays open, the bytes held."""
    c = raw()
    c.pump(0.2)
    try:
        c.sock.sendall(struct.pack(">IBI", 0xFFFFFF << 8 | kind, 0, 0 if kind == 0x7 else 1) + b"\0" * (2 << 20))
        c.ping(b"afterall")
    except (BrokenPipeError, ConnectionResetError):
        return  # closed while the junk was still going: as it should
    c.wait("the connection closed", lambda: c.eof, 3)


def test_a_malformed_request_header_fails_its_own_stream_not_the_connection(fleet: Fleet, raw: Raw) -> None:
    """A GenerateStream runs; on the same connection a second call's HEADERS carry an uppercase header name
    (RFC 9113 8.2.1: a malformed request, a stream error). h2 raises ProtocolError out of receive_data for
    the whole batch, and Connection.data_received closes the connection, so the running stream dies with it
    (its engine request aborted). grpc.aio answers only the bad stream (INTERNAL, "Illegal header key") and
    the other calls go on; so do "connection: close" and "te: gzip". Held now: the running stream ends OK
    on a connection still open. Before the fix: the connection is closed."""
    c = raw()
    running = c.request("/fleet.v1.Inference/GenerateStream", grpc_frame(pb2.GenerateRequest(
        token_ids=list(range(100, 140)), sampling_params=pb2.SamplingParams(max_tokens=200, temperature=0.0,
                                                                            ignore_eos=True)).SerializeToString()),
        headers=HEADERS)
    c.wait("the running stream's first message", lambda: len(c.streams[running].data) > 0)
    c.conn.config.validate_outbound_headers = False  # let the client send what h2 would refuse to
    c.conn.config.normalize_outbound_headers = False
    c.request(GENERATE, grpc_frame(REQUEST), headers=(*HEADERS, ("X-Upper", "v")))
    c.wait("the running stream's end", lambda: c.streams[running].closed, 10)
    assert c.streams[running].status.get("grpc-status") == "0", c.streams[running].status
    _still_serves(fleet, c)


def test_a_ping_flood_is_cut_off_not_answered_ping_by_ping(fleet: Fleet, raw: Raw) -> None:
    """One connection sends 50,000 PINGs (17 bytes each, no call open) and reads what comes back. h2 answers
    every one, on API server 0's event loop, which also serves HTTP and every stream: while one client
    floods, /health on the frontend's HTTP port takes ~10 s instead of ~1 ms (measured by hand, 5 requests,
    median). grpc's own server allows two pings without data (grpc.http2.max_ping_strikes) then sends
    GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes. Held now: the port cuts the connection off long
    before answering them all. Before the fix: 50,000 PING ACKs."""
    c = raw()
    c.pump(0.2)
    flood = struct.pack(">IBI", 8 << 8 | 0x6, 0, 0) + b"floodpng"
    try:
        c.sock.sendall(flood * 50_000)
    except (BrokenPipeError, ConnectionResetError):
        return  # cut off while still sending: as it should
    acks = 0

    def cut_off_or_all_answered() -> bool:
        nonlocal acks
        acks = sum(1 for e in c.events if isinstance(e, h2.events.PingAckReceived))
        return c.eof or acks >= 50_000 or any(isinstance(e, h2.events.ConnectionTerminated) for e in c.events)

    c.wait("the flood answered or cut off", cut_off_or_all_answered, 20)
    assert acks < 50_000, "every PING of the flood was answered"
