"""The frontend's only socket thread: one DEALER per engine rank (requests, handshake, outputs, Stats)
and one SUB per rank (its KV events), bridged to the event loop.

Everything received in one wake-up is handed to the loop as one batch, through one
call_soon_threadsafe, so a burst of engine steps costs one loop wake-up, not one per message.
Each DEALER is watched by a ZMQ socket monitor: its connection closing (the engine process died,
or closed its socket) is told to the loop at once rather than found by heartbeat deadline.
Each rank's sockets live in a ZMQ context of their own, so in an I/O thread of their own: libzmq
resolves an engine's host name in the I/O thread, blocking, at every reconnect, and a rank whose name
does not resolve (its container restarting, the DNS server away) must not silence the other ranks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from protocol import AllCleared, BlockRemoved, BlockStored, Stats
from protocol.version import MAJOR

log = logging.getLogger(__name__)

# Channel of an inbound item. SEND_FAILED: frames the DEALER refused (no live connection, so they
# never left this process); DISCONNECTED / CONNECTED: the connection to the engine closed / was made;
# FLUSHED: every send queued before flush() has been tried (any refused one reported before it).
DEALER, SUB, SEND_FAILED, CONNECT_FAILED, DISCONNECTED, CONNECTED, FLUSHED = range(7)
MONITOR = -1  # channel_of entry of a DEALER's monitor socket, never handed to the loop
Inbound = tuple[int, int, list[Any]]  # (engine index, channel, frames; for CONNECT_FAILED: [reason])
_WATCHED = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class Bridge:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_batch: Callable[[list[Inbound], float], None],
                 identity: str, on_dead: Callable[[str], None] | None = None, hold_stats_s: float = 0.0) -> None:
        """on_batch(batch, received_at): received_at is when the thread read it (time.monotonic()), which
        can be well before the loop runs the callback in a burst. `hold_stats_s`: how long a batch of
        nothing but Stats may wait for company before the loop is woken for it (idle_hold)."""
        self._loop = loop
        self._hold_s = hold_stats_s
        # Set by the loop: nothing is in flight and no reply is awaited (every rank handshaken, no request
        # or utility call open), so the engines' sockets need reading only every `hold_stats_s` (idle_hold).
        self.quiet = False
        self._on_batch = on_batch
        self._on_dead = on_dead  # told, on the loop, why the socket thread stopped when nobody asked it to
        self._identity = identity.encode()
        self._contexts: dict[int, zmq.Context[zmq.Socket[bytes]]] = {}  # per rank; made, used, ended by the thread
        self._commands: deque[tuple[str, int, Any]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        self._wake_pending = False  # a byte is in the pipe that the thread has not yet seen (_wake)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="frontend-sockets", daemon=True)
        self._thread.start()

    # ---- called from the event loop ----

    def connect(self, index: int, address: str) -> None:
        self._command("connect", index, address)

    def subscribe(self, index: int, address: str) -> None:
        self._command("subscribe", index, address)

    def send(self, index: int, frames: list[Any]) -> None:
        self._command("send", index, frames)

    def flush(self, index: int) -> None:
        """Ask for a FLUSHED item once every send queued so far to this engine has been tried."""
        self._command("flush", index, None)

    def close(self) -> None:
        self._closing = True
        self._wake()
        self._thread.join(2)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _command(self, op: str, index: int, arg: Any) -> None:
        self._commands.append((op, index, arg))
        self._wake()

    def _wake(self) -> None:
        # One byte per wake-up, not per command: a burst of requests (256 submits in one loop pass)
        # would otherwise pay a pipe write each. The thread clears the flag before it drains the pipe
        # and then takes every queued command, so a command queued after the clear writes again.
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # wake-ups already pending: the thread drains every command anyway

    # ---- the socket thread ----

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        dealers: dict[int, zmq.Socket] = {}
        subs: dict[int, zmq.Socket] = {}
        monitors: dict[int, zmq.Socket] = {}
        channel_of: dict[zmq.Socket, tuple[int, int]] = {}
        held: list[Inbound] = []  # Stats that came alone, not yet handed to the loop (idle_hold)
        held_since = held_at = 0.0
        quiet, drain_at = False, 0.0  # quiet: the DEALERs and SUBs are not polled, only drained at drain_at
        try:
            while not self._closing:
                batch: list[Inbound] = []
                now = time.monotonic()
                if (self._hold_s > 0 and self.quiet) != quiet:
                    quiet = not quiet
                    for sock in (*dealers.values(), *subs.values()):
                        poller.modify(sock, 0 if quiet else zmq.POLLIN)
                    drain_at = now + self._hold_s
                if quiet:
                    timeout: int | None = int(max(0.0, drain_at - now) * 1000) + 1
                elif held:
                    timeout = int(max(0.0, held_since + self._hold_s - now) * 1000) + 1
                else:
                    timeout = None
                ready = poller.poll(timeout)
                drained = quiet and (time.monotonic() >= drain_at or bool(self._commands))
                if drained:  # awake anyway, or due: read what the engines sent meanwhile
                    ready += [(sock, 0) for sock in (*dealers.values(), *subs.values())]
                    drain_at = time.monotonic() + self._hold_s
                for sock, polled in ready:
                    if sock == self._wake_r:
                        self._wake_pending = False
                        try:
                            while os.read(self._wake_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                        continue
                    index, channel = channel_of[sock]
                    # Readable as polled, or asked (a drain): more is asked after each message, as a socket
                    # option read, which costs less than the zmq.Again a last empty read would raise.
                    while polled or sock.get(zmq.EVENTS) & zmq.POLLIN:
                        polled = 0
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:  # only this thread reads, so not expected; never a reason to stop
                            break
                        if channel == MONITOR:
                            event = parse_monitor_message(frames)["event"]
                            batch.append((index, DISCONNECTED if event == zmq.EVENT_DISCONNECTED else CONNECTED,
                                          []))
                        else:
                            batch.append((index, channel, frames))
                commanded = bool(self._commands)
                while self._commands:
                    op, index, arg = self._commands.popleft()
                    if op == "send":
                        try:
                            dealers[index].send_multipart(arg, zmq.NOBLOCK)
                        except (zmq.Again, KeyError):  # no live connection (IMMEDIATE): it never left
                            batch.append((index, SEND_FAILED, arg))
                    elif op == "flush":
                        batch.append((index, FLUSHED, []))
                    elif op in ("connect", "subscribe"):
                        try:
                            self._open(op, index, arg, poller, dealers, subs, monitors, channel_of)
                        except zmq.ZMQError as exc:  # this engine's address only: the others carry on
                            batch.append((index, CONNECT_FAILED, [f"cannot {op} to {arg}: {exc}"]))
                now = time.monotonic()
                if (self._hold_s and batch and not commanded and not drained
                        and all(_is_stats(item) for item in batch)):
                    if not held:
                        held_since = now
                    held += batch
                    held_at = now
                    batch = []
                if held and (batch or commanded or now - held_since >= self._hold_s):
                    self._loop.call_soon_threadsafe(self._on_batch, held, held_at)
                    held = []
                if batch:
                    self._loop.call_soon_threadsafe(self._on_batch, batch, now)
        except Exception as exc:  # zmq.ZMQError, or a bug: without this thread no engine is reachable
            if self._closing or self._loop.is_closed():
                return
            log.exception("frontend socket thread stopped")
            if self._on_dead is not None:
                try:
                    self._loop.call_soon_threadsafe(self._on_dead, f"{type(exc).__name__}: {exc}")
                except RuntimeError:  # the loop closed meanwhile
                    pass
        finally:
            for index in list(monitors):
                self._unwatch(poller, dealers[index], monitors, channel_of, index)
            for sock in [*dealers.values(), *subs.values()]:
                sock.close()
            for ctx in self._contexts.values():
                ctx.term()

    # ---- idle_hold ----
    # An idle engine still sends Stats about every 100 ms (its liveness and load). A batch of nothing but
    # those, with no command from the loop meanwhile, waits up to `hold_stats_s` for company instead of
    # waking the loop: an idle frontend's loop wakes a few times a second rather than ten times per rank.
    # Anything else (outputs, a refusal, a connection event) or any command (the loop is serving: a
    # request, a heartbeat) hands the held Stats over at once, each batch with the time it was read.
    # When the loop says `quiet` (nothing in flight, no reply awaited), this thread does not even wake
    # for them: it polls only its wake-up pipe and the connection monitors (a closed connection is still
    # told at once) and reads the engines' sockets when it is awake anyway (a command: the loop's own
    # heartbeats) or every `hold_stats_s`. A request or a utility call clears `quiet` before its send.

    def _open(self, op: str, index: int, address: str, poller: zmq.Poller, dealers: dict[int, zmq.Socket],
              subs: dict[int, zmq.Socket], monitors: dict[int, zmq.Socket],
              channel_of: dict[zmq.Socket, tuple[int, int]]) -> None:
        ctx = self._contexts.get(index)
        if ctx is None:
            # Seen with podman: a restarted engine's name failed to resolve for 40 s, each try blocking the
            # I/O thread; with one context for all ranks the others went silent and were declared dead.
            ctx = self._contexts[index] = zmq.Context()
        if op == "connect":
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self._identity)
            # Queue only to a live connection, so a Hello or a request is never held for an engine that
            # is down and then delivered stale when it returns.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            table, channel = dealers, DEALER
        else:
            sock = ctx.socket(zmq.SUB)
            for prefix in _SUBSCRIBED:
                sock.setsockopt(zmq.SUBSCRIBE, prefix)
            sock.setsockopt(zmq.LINGER, 0)
            table, channel = subs, SUB
        monitor = None
        try:
            if op == "connect":  # watched before it connects, so no event is missed
                monitor = sock.get_monitor_socket(_WATCHED)
                monitor.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        except zmq.ZMQError:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close()
            sock.close()
            raise
        if op == "connect" and index in monitors:
            self._unwatch(poller, dealers[index], monitors, channel_of, index)
        self._replace(poller, table, channel_of, index, sock, channel)
        if monitor is not None:
            monitors[index] = monitor
            channel_of[monitor] = (index, MONITOR)
            poller.register(monitor, zmq.POLLIN)

    @staticmethod
    def _unwatch(poller: zmq.Poller, dealer: zmq.Socket, monitors: dict[int, zmq.Socket],
                 channel_of: dict[zmq.Socket, tuple[int, int]], index: int) -> None:
        monitor = monitors.pop(index)
        poller.unregister(monitor)
        channel_of.pop(monitor, None)
        dealer.disable_monitor()
        monitor.close()

    @staticmethod
    def _replace(poller: zmq.Poller, table: dict[int, zmq.Socket], channel_of: dict[zmq.Socket, tuple[int, int]],
                 index: int, sock: zmq.Socket, channel: int) -> None:
        old = table.pop(index, None)
        if old is not None:
            poller.unregister(old)
            channel_of.pop(old, None)
            old.close()
        table[index] = sock
        channel_of[sock] = (index, channel)
        poller.register(sock, zmq.POLLIN)


_STATS = bytes((Stats.TAG,))
# What this process reads from an engine's PUB: its KV events, of any minor version of this major (a
# header frame starts (major, minor, tag)). Not its Stats: every one of those also comes direct, on the
# DEALER, and the PUB's copies (sent when the load changed: at every step of a busy engine) would only
# wake this thread a second time a step, to be dropped as already seen. The engine's PUB filters, so they
# do not even cross the socket.
_SUBSCRIBED = tuple(bytes((MAJOR, minor, tag)) for tag in (BlockStored.TAG, BlockRemoved.TAG, AllCleared.TAG)
                    for minor in range(256))


def _is_stats(item: Inbound) -> bool:
    """A DEALER or SUB item holding a Stats message (its header's tag byte), whatever its version."""
    _, channel, frames = item
    return channel in (DEALER, SUB) and len(frames) >= 2 and len(frames[0]) == 3 and frames[0][2:3] == _STATS
