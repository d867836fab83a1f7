"""The engine's socket thread over real loopback sockets: a peer whose connection closes is told to the
core loop (an empty frame list), at once after the monitor's report and, should the probes that follow
it be lost, by the next beat; a peer that comes back is heard again."""
from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest
import zmq

from services.engine import bridge as bridge_module
from services.engine.bridge import Bridge


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:  # type: ignore[type-arg]
    c = zmq.Context()
    yield c
    c.term()


def _peer(ctx: zmq.Context, endpoint: str, identity: bytes) -> zmq.Socket:  # type: ignore[type-arg]
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(b"hello")
    return sock


def _next(bridge: Bridge, timeout_s: float = 10.0) -> tuple[bytes, list[bytes]]:
    identity, frames = bridge.inbox.get(timeout=timeout_s)
    return identity, [f.bytes for f in frames]


def _closed_after_close(ctx: zmq.Context, beat_s: float) -> tuple[Bridge, float]:  # type: ignore[type-arg]
    bridge = Bridge(ctx, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", beat_interval_s=beat_s)
    endpoint = bridge._router.getsockopt_string(zmq.LAST_ENDPOINT)
    peer = _peer(ctx, endpoint, b"fe-1")
    assert _next(bridge) == (b"fe-1", [b"hello"])
    bridge.peers = (b"fe-1",)
    t0 = time.monotonic()
    peer.close()
    assert _next(bridge) == (b"fe-1", [])  # told once: closed
    return bridge, time.monotonic() - t0


def test_a_closed_connection_is_told_at_once(ctx: zmq.Context) -> None:  # type: ignore[type-arg]
    bridge, _ = _closed_after_close(ctx, beat_s=3600.0)  # no beat in time: the monitor's probe found it
    with pytest.raises(queue.Empty):
        bridge.inbox.get(timeout=0.3)  # told once, though the probes go on failing
    # It connects again: heard again, and a later close is told again.
    endpoint = bridge._router.getsockopt_string(zmq.LAST_ENDPOINT)
    again = _peer(ctx, endpoint, b"fe-1")
    assert _next(bridge) == (b"fe-1", [b"hello"])
    again.close()
    assert _next(bridge) == (b"fe-1", [])
    bridge.close()


def test_without_the_probes_the_next_beat_still_finds_it(ctx: zmq.Context,  # type: ignore[type-arg]
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bridge_module, "PROBE_AFTER_S", ())  # as if every probe went into the closing pipe
    bridge, _ = _closed_after_close(ctx, beat_s=0.05)
    bridge.close()
