"""The frontend's only socket thread: one DEALER per engine rank (requests, handshake, outputs) and
one SUB per rank (KV events, load), bridged to the event loop.

Everything received in one wake-up is handed to the loop as one batch, through one
call_soon_threadsafe, so a burst of engine steps costs one loop wake-up, not one per message.
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

log = logging.getLogger(__name__)

DEALER, SUB, SEND_FAILED, CONNECT_FAILED = 0, 1, 2, 3  # channel of an inbound item
Inbound = tuple[int, int, list[Any]]  # (engine index, channel, frames; for CONNECT_FAILED: [reason])


class Bridge:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_batch: Callable[[list[Inbound], float], None],
                 identity: str, on_dead: Callable[[str], None] | None = None) -> None:
        """on_batch(batch, received_at): received_at is when the thread read it (time.monotonic()), which
        can be well before the loop runs the callback in a burst."""
        self._loop = loop
        self._on_batch = on_batch
        self._on_dead = on_dead  # told, on the loop, why the socket thread stopped when nobody asked it to
        self._identity = identity.encode()
        self._ctx = zmq.Context()
        self._commands: deque[tuple[str, int, Any]] = deque()
        self._wake_r, self._wake_w = os.pipe()
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
        channel_of: dict[zmq.Socket, tuple[int, int]] = {}
        try:
            while not self._closing:
                batch: list[Inbound] = []
                for sock, _ in poller.poll():
                    if sock == self._wake_r:
                        try:
                            while os.read(self._wake_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                        continue
                    index, channel = channel_of[sock]
                    while True:
                        try:
                            batch.append((index, channel, sock.recv_multipart(zmq.NOBLOCK)))
                        except zmq.Again:
                            break
                while self._commands:
                    op, index, arg = self._commands.popleft()
                    if op == "send":
                        try:
                            dealers[index].send_multipart(arg, zmq.NOBLOCK)
                        except (zmq.Again, KeyError):  # no live connection (IMMEDIATE): say so
                            batch.append((index, SEND_FAILED, arg))
                    elif op in ("connect", "subscribe"):
                        try:
                            self._open(op, index, arg, poller, dealers, subs, channel_of)
                        except zmq.ZMQError as exc:  # this engine's address only: the others carry on
                            batch.append((index, CONNECT_FAILED, [f"cannot {op} to {arg}: {exc}"]))
                if batch:
                    self._loop.call_soon_threadsafe(self._on_batch, batch, time.monotonic())
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
            for sock in [*dealers.values(), *subs.values()]:
                sock.close()
            self._ctx.term()

    def _open(self, op: str, index: int, address: str, poller: zmq.Poller, dealers: dict[int, zmq.Socket],
              subs: dict[int, zmq.Socket], channel_of: dict[zmq.Socket, tuple[int, int]]) -> None:
        if op == "connect":
            sock = self._ctx.socket(zmq.DEALER)
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
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.LINGER, 0)
            table, channel = subs, SUB
        try:
            sock.connect(address)
        except zmq.ZMQError:
            sock.close()
            raise
        self._replace(poller, table, channel_of, index, sock, channel)

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
