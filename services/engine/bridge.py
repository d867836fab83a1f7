"""The engine's only socket thread: bridges the ROUTER and PUB sockets to in-process queues.

The core loop never touches a socket: it reads `inbox` and hands outgoing batches to `send`/`publish`,
which wake this thread through a pipe so it can sleep in one poll over both directions.
This thread also sends liveness Heartbeats to every peer on its own, so one long engine step (a big
prefill, a compile) does not get a healthy engine declared dead; it stops when the core loop has made
no progress for `stall_timeout_s`, so a hung engine still is.

A peer whose connection closed is told to the core loop at once (an empty frame list in `inbox`), so
its requests are aborted then, not at --client-timeout. libzmq's ROUTER_NOTIFY is a draft API absent
from the bundled libzmq, and a socket monitor names a file descriptor, not a peer; so the ROUTER is
ROUTER_MANDATORY: a send to an identity with no connection fails (EHOSTUNREACH) instead of vanishing,
and that failure names the peer. Every peer gets something at least every beat interval, and when the
monitor reports a connection closed, every peer is probed at once and a few times after: the monitor
event comes before libzmq takes the peer's pipe down, so a probe sent right after it can still be
accepted and lost; only a later send fails.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from protocol import Frames, Heartbeat, encode

log = logging.getLogger(__name__)

Inbound = tuple[bytes, list[zmq.Frame]]  # (peer identity, frames); no frames: its connection closed
# After the monitor reports a closed connection: when to probe every peer, in seconds after the report.
PROBE_AFTER_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
UNREACHABLE_MAX = 4096  # peers told closed, remembered so each is told once; forgotten all at once past this
# After the last messages (a drain's final outputs, EngineDead) the connections stay open this long
# before the socket closes: a frontend's DEALER (ZMQ_IMMEDIATE) drops what it has not read yet when its
# connection drops, so closing at once can lose them. Input meanwhile is read and dropped, which also
# keeps the close from being a reset (unread input) that would discard what is still unsent.
FAREWELL_S = 0.25


class BindError(Exception):
    """A socket could not bind its endpoint (the port is taken, the host is not this machine's)."""


class Bridge:
    """Binds at once, so a taken port is known before the model loads; `pub_port` is the port bound."""

    def __init__(self, ctx: zmq.Context, router_endpoint: str, pub_endpoint: str, *,
                 beat_interval_s: float = 0.1, stall_timeout_s: float = 60.0) -> None:
        self.inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        # Written by the core loop, read here: plain attribute swaps, atomic under the GIL.
        self.peers: tuple[bytes, ...] = ()
        self.loop_alive_at = time.monotonic()
        self._beat_interval = beat_interval_s
        self._stall_timeout = stall_timeout_s
        self._outbox: deque[tuple[bytes | None, Sequence[Frames]]] = deque()
        self._router = ctx.socket(zmq.ROUTER)
        # Outputs are never dropped for a slow reader: a dead one is found by heartbeat deadline.
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.setsockopt(zmq.RCVHWM, 0)
        self._router.setsockopt(zmq.LINGER, 2000)
        # A send to a peer without a connection raises EHOSTUNREACH rather than being dropped unseen.
        # ROUTER_HANDOVER stays off: a second connection claiming a connected peer's identity is refused.
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        for name, sock, endpoint in (("ROUTER", self._router, router_endpoint), ("PUB", self._pub, pub_endpoint)):
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                self._router.disable_monitor()
                self._monitor.close()
                self._router.close()
                self._pub.close()
                raise BindError(f"cannot bind the {name} socket to {endpoint}: {exc.strerror}") from None
        # The port bound, also when the endpoint asked the OS for one ("tcp://host:*").
        self.pub_port = int(self._pub.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._closing = False
        self._unreachable: set[bytes] = set()  # peers told closed and not heard from since
        self._thread = threading.Thread(target=self._run, name="engine-sockets", daemon=True)
        self._thread.start()

    def send(self, batch: Sequence[tuple[bytes, Frames]]) -> None:
        """Queue messages to peers (by identity) and wake the socket thread once."""
        for identity, frames in batch:
            self._outbox.append((identity, (frames,)))
        self._wake()

    def publish(self, batch: Sequence[Frames]) -> None:
        if batch:
            self._outbox.append((None, batch))
            self._wake()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued, then close the sockets (from the socket thread, which owns them)."""
        self._closing = True
        self._wake()
        self._thread.join(timeout_s)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already; the thread will drain the outbox anyway

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        router, pub, outbox, inbox, monitor = self._router, self._pub, self._outbox, self.inbox, self._monitor
        beat_ms = int(self._beat_interval * 1000)
        last_beat, seq = 0.0, 0
        # When each peer was last sent anything: any message is a sign of life, so a peer that got the
        # core loop's Stats (or outputs) within the interval needs no Heartbeat from this thread too.
        last_sent: dict[bytes, float] = {}
        probes: list[float] = []  # when to probe every peer next (after a closed connection), soonest last
        try:
            while True:
                timeout = beat_ms if not probes else max(0, int((probes[-1] - time.monotonic()) * 1000))
                events = dict(poller.poll(timeout))
                now = time.monotonic()
                if monitor in events:
                    while True:
                        try:
                            monitor.recv_multipart(zmq.NOBLOCK)  # EVENT_DISCONNECTED, the only one watched
                        except zmq.Again:
                            break
                        probes = sorted((now + after for after in PROBE_AFTER_S), reverse=True)
                probe = bool(probes) and probes[-1] <= now
                while probes and probes[-1] <= now:
                    probes.pop()
                due = now - last_beat >= self._beat_interval
                if due:
                    last_beat = now
                    if len(last_sent) > 2 * len(self.peers) + 16:  # peers that left
                        live = set(self.peers)
                        last_sent = {p: t for p, t in last_sent.items() if p in live}
                # A stalled loop gets no beats, probes included: any message tells a peer this rank lives.
                if (due or probe) and now - self.loop_alive_at < self._stall_timeout:
                    if probe:
                        router.getsockopt(zmq.EVENTS)  # take in libzmq's pending pipe terminations first
                    beat: Frames | None = None
                    for peer in self.peers:
                        if not probe and now - last_sent.get(peer, 0.0) < 2 * self._beat_interval:
                            continue
                        if beat is None:
                            seq += 1
                            beat = encode(Heartbeat(seq, time.time()))
                        self._send(peer, beat)
                        last_sent[peer] = now
                if router in events:
                    while True:
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        identity = frames[0].bytes
                        self._unreachable.discard(identity)
                        inbox.put((identity, frames[1:]))
                if self._wake_r in events:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                while outbox:
                    identity, batch = outbox.popleft()
                    if identity is None:
                        for frames in batch:
                            pub.send_multipart(frames, copy=False)
                    else:
                        self._send(identity, batch[0])
                        last_sent[identity] = now
                if self._closing and not outbox:
                    self._farewell()
                    return
        except zmq.ZMQError as exc:
            log.error("engine socket thread stopped: %s", exc)
        finally:
            router.disable_monitor()
            monitor.close()
            router.close()
            pub.close()

    def _send(self, identity: bytes, frames: Frames) -> None:
        """Send to a peer; one without a connection is told to the core loop (once until it is heard again)."""
        try:
            self._router.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            if identity not in self._unreachable:
                if len(self._unreachable) >= UNREACHABLE_MAX:  # identities that never came back (probes')
                    self._unreachable.clear()
                self._unreachable.add(identity)
                self.inbox.put((identity, []))

    def _farewell(self) -> None:
        """Keep the connections open for FAREWELL_S after the last send, reading and dropping input."""
        deadline = time.monotonic() + FAREWELL_S
        while (left := deadline - time.monotonic()) > 0:
            if self._router.poll(int(left * 1000) + 1):
                try:
                    while self._router.recv_multipart(zmq.NOBLOCK, copy=False):
                        pass
                except zmq.Again:
                    pass
