"""A client-streaming call served on the gRPC port's own connection (grpc_port.py): RlControl.UpdateWeights,
its messages parsed from DATA as they come (tensor_message.py) and handed to the same handler grpc.aio
runs (rl_control.py), the client's bytes given back to its windows only as the handler takes them.
Runs on API server 0's event loop."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError

from edge.api_keys import ApiKeys
from services.frontend.grpc_api import tensor_message
from services.frontend.grpc_api.native_call import Connection, PortCall, frame
from services.frontend.grpc_api.rpc import CallContext, Failed


class WeightUpdates(Protocol):
    """The handler behind the call (RlControl's)."""

    async def UpdateWeights(self, request_iterator: AsyncIterator[Any], context: CallContext) -> Any: ...


class UploadCall(PortCall):
    """One UpdateWeights call. Its handler starts at once, as grpc.aio's does, and takes the messages as
    they are whole. Memory is bounded by flow control: received bytes are given back to the client's
    windows while the call holds at most one message's worth that the handler has not taken (a message
    still coming in counts: it must be able to arrive whole), so a slow handler (a slow engine) holds
    the client at its window, and the call never holds more than the limit plus one stream window."""

    def __init__(self, conn: Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
                 handler: WeightUpdates, keys: ApiKeys, limit: int) -> None:
        # The next message as far as it came: its length prefix, or its bytes (views of the DATA frames
        # they came in, joined once it is whole: one copy, none when one frame holds it).
        self._prefix = bytearray()
        self._need = -1  # the bytes of the message still to come; -1: its prefix is
        self._flag = 0  # its compressed flag
        self._chunks: list[memoryview] = []
        self._queue: deque[tuple[int, bytes | memoryview]] = deque()  # whole messages: (compressed flag, bytes)
        self.held = 0  # bytes received that the handler has not taken
        self._owed = 0  # flow-controlled bytes not given back yet
        self._hold = limit + 5  # the bytes held past the windows: one message
        self._waiter: asyncio.Future[None] | None = None
        super().__init__(conn, stream_id, "UpdateWeights", headers, keys, limit)
        if not self.closed:
            self._handler = handler
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # ---- the client's side of the stream (Connection dispatches its events, the windows to us) ----

    def on_data(self, data: bytes, flow_controlled: int = 0) -> None:
        self.on_pieces([memoryview(data)], flow_controlled)

    def on_pieces(self, pieces: list[memoryview], flow_controlled: int) -> None:
        """A DATA frame's payload, in pieces (views of the bytes read: h2_frames.FrameWatch)."""
        self._owed += flow_controlled
        if self.closed or self._why is not None:  # ended, or ending (a refused message): nothing more is held
            self._give_back(everything=True)
            return
        for view in pieces:
            if not self._take(view):
                return
        self._give_back()
        self._wake()

    def _take(self, view: memoryview) -> bool:
        """A piece of the stream into messages; False once a message is refused (the call ends)."""
        self.held += len(view)
        pos, n = 0, len(view)
        while pos < n:
            if self._need < 0:  # the length prefix
                prefix = self._prefix
                take = min(5 - len(prefix), n - pos)
                prefix += view[pos:pos + take]
                pos += take
                if len(prefix) < 5:
                    break
                size = int.from_bytes(prefix[1:5], "big")
                if size > self._limit:  # from its length prefix: never held
                    self.cancel(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"Received message larger than max ({size} vs. {self._limit})")
                    return False
                self._flag, self._need = prefix[0], size
                prefix.clear()
            take = min(self._need, n - pos)
            if take:
                self._chunks.append(view[pos:pos + take])
                pos += take
                self._need -= take
            if not self._need:
                chunks, self._chunks, self._need = self._chunks, [], -1
                self._queue.append((self._flag, chunks[0] if len(chunks) == 1 else b"".join(chunks)))
        return True

    def on_end(self) -> None:
        self.remote_ended = True
        self._wake()

    def on_reset(self, code: int) -> None:
        self._give_back(everything=True)
        super().on_reset(code)

    def finish(self, code: grpc.StatusCode, message: str) -> None:
        if not self.closed:
            self._give_back(everything=True)
            self._queue.clear()
            self._chunks = []
        super().finish(code, message)

    def _give_back(self, *, everything: bool = False) -> None:
        """Acknowledge the received bytes the call may hold past the windows (all when it ends)."""
        owed = self._owed
        if not owed:
            return
        n = owed if everything or self.closed else min(owed, max(0, self._hold - (self.held - owed)))
        if n:
            self._owed -= n
            self.conn.acknowledge(self.stream_id, n)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- the handler's side ----

    async def _work(self) -> None:
        response = await self._handler.UpdateWeights(self._messages(), self)
        await self.send(frame(response.SerializeToString()))

    async def _messages(self) -> AsyncIterator[Any]:
        """The request messages, parsed as the handler takes them; each one taken lets the client send more."""
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            while not queue:
                if self.remote_ended:
                    if self._prefix or self._need >= 0:
                        raise Failed(grpc.StatusCode.INTERNAL, "the request stream ended inside a message")
                    return
                self._waiter = loop.create_future()
                await self._waiter
                self._waiter = None
            compressed, message = queue.popleft()
            self.held -= 5 + len(message)
            self._give_back()
            self.conn.flush()
            if compressed:
                message = self.inflate(message)
            try:
                tensor = tensor_message.parse(message)
            except DecodeError:
                raise Failed(grpc.StatusCode.INTERNAL, "Exception deserializing request!") from None
            yield tensor

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """The handler's refusal (rpc.guard's, as grpc.aio's ServicerContext.abort): the call's status."""
        raise Failed(code, details)
