"""A small synchronous engine-protocol client for tests: one DEALER, handshake, requests, outputs.

A daemon thread sends heartbeats (unless built silent, to test peer deadlines); a lock serialises
every use of the socket, which is what ZMQ asks of a socket shared between threads.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq

from protocol import (
    Abort,
    GenerateRequest,
    Heartbeat,
    Message,
    Outputs,
    Ready,
    Reject,
    RequestTimings,
    SamplingParams,
    Stats,
    UtilityCall,
    UtilityResult,
    decode,
    encode,
    make_hello,
)
from protocol.logprobs import Buffer, unpack


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    error_kind: str | None = None
    steps: list[int] = field(default_factory=list)
    # Packed logprobs read back, a row per position: (own token and its alternatives, their logprobs, rank).
    logprobs: list[tuple[list[int], list[float], int]] = field(default_factory=list)
    prompt_logprobs: list[tuple[list[int], list[float], int]] = field(default_factory=list)
    # The timings of the outputs that carried them (protocol 1.4: the first token's, then the finish's).
    timings: list[RequestTimings] = field(default_factory=list)


class EngineClient:
    def __init__(self, endpoint: str, frontend_id: str | None = None, *, heartbeat_s: float | None = 0.2,
                 ctx: zmq.Context | None = None) -> None:
        self.frontend_id = frontend_id or f"test-{uuid.uuid4().hex[:6]}"
        self._ctx = ctx or zmq.Context.instance()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, self.frontend_id.encode())
        self.sock.connect(endpoint)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.stats: list[Stats] = []
        self.beats = 0
        self.others: list[Message] = []
        self._heartbeat_s = heartbeat_s
        self.raw_frames: list[bytes] = []  # the raw frames after the body of the last message recv() gave

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self.sock.close()

    def send(self, msg: Message) -> None:
        self.send_raw(encode(msg))

    def send_raw(self, frames: list) -> None:  # type: ignore[type-arg]
        with self._lock:
            self.sock.send_multipart(frames)

    def _beat(self, interval_s: float) -> None:
        seq = 0
        while not self._closed.wait(interval_s):
            seq += 1
            with self._lock:
                if self._closed.is_set():
                    return
                self.sock.send_multipart(encode(Heartbeat(seq, time.time())))

    def recv(self, timeout_s: float = 10.0, *, any_major: bool = False) -> Message:
        """Next message that is not a Stats heartbeat (those are kept in self.stats)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message from the engine within {timeout_s}s")
            with self._lock:  # short polls, so the heartbeat thread gets the socket in between
                frames = self.sock.recv_multipart() if self.sock.poll(min(left, 0.05) * 1000) else None
            if frames is not None:
                msg = decode(frames, any_major=any_major)
                if isinstance(msg, Stats):
                    self.stats.append(msg)
                    continue
                if isinstance(msg, Heartbeat):  # the engine's socket thread beats on its own
                    self.beats += 1
                    continue
                self.raw_frames = frames[2:]
                return msg

    def handshake(self, hello: Message | None = None, timeout_s: float = 10.0) -> Ready | Reject:
        self.send(hello or make_hello(self.frontend_id))
        msg = self.recv(timeout_s, any_major=True)
        assert isinstance(msg, (Ready, Reject)), msg
        if isinstance(msg, Ready) and self._heartbeat_s is not None:
            threading.Thread(target=self._beat, args=(self._heartbeat_s,), daemon=True).start()
            self._heartbeat_s = None  # one beating thread per client
        return msg

    def generate(self, request_id: str, prompt: list[int], **sampling: object) -> None:
        sampling.setdefault("max_tokens", 16)
        self.send(GenerateRequest(request_id, prompt, SamplingParams(**sampling), time.time()))  # type: ignore[arg-type]

    def abort(self, *request_ids: str) -> None:
        self.send(Abort(list(request_ids)))

    def utility(self, name: str, /, timeout_s: float = 10.0, *, frames: Sequence[Buffer] = (),
                **args: object) -> UtilityResult:
        """Call a utility and wait for its result; `frames` travel as the call's raw frames."""
        call_id = self.send_utility(name, frames=frames, **args)
        return self.utility_result(call_id, timeout_s)

    def send_utility(self, name: str, /, *, frames: Sequence[Buffer] = (), **args: object) -> int:
        """Send a utility call without waiting; its call id (for utility_result)."""
        call_id = int(time.monotonic_ns() % 2**31)
        self.send_raw(encode(UtilityCall(call_id, name, dict(args)), *frames))
        return call_id

    def utility_result(self, call_id: int, timeout_s: float = 10.0) -> UtilityResult:
        """The result of call `call_id`; messages that come first are kept in self.others."""
        while True:
            msg = self.recv(timeout_s)
            if isinstance(msg, UtilityResult) and msg.call_id == call_id:
                return msg
            if isinstance(msg, Reject):
                raise ConnectionRefusedError(f"engine refused: {msg.code}: {msg.reason}")
            self.others.append(msg)

    def collect(self, request_ids: list[str], timeout_s: float = 30.0) -> dict[str, Result]:
        """Outputs until every named request finished."""
        results = {rid: Result() for rid in request_ids}
        pending = set(request_ids)
        deadline = time.monotonic() + timeout_s
        while pending:
            msg = self.recv(max(0.01, deadline - time.monotonic()))
            if isinstance(msg, Reject):
                raise ConnectionRefusedError(f"engine refused: {msg.code}: {msg.reason}")
            if not isinstance(msg, Outputs):
                self.others.append(msg)
                continue
            for out in msg.outputs:
                r = results.get(out.request_id)
                assert r is not None, f"got output for a request this client did not send: {out.request_id}"
                r.token_ids += out.new_token_ids
                r.steps.append(msg.step)
                r.num_cached_tokens = max(r.num_cached_tokens, out.num_cached_tokens)
                if out.timings is not None:
                    r.timings.append(out.timings)
                for ref, rows in ((out.packed_logprobs, r.logprobs), (out.packed_prompt_logprobs, r.prompt_logprobs)):
                    if ref is not None:
                        seg = unpack(self.raw_frames, ref)
                        w = seg.width
                        rows += [(list(seg.token_ids[i * w:(i + 1) * w]), list(seg.logprobs[i * w:(i + 1) * w]),
                                  seg.ranks[i]) for i in range(seg.positions)]
                if out.finish_reason is not None:
                    r.finish_reason, r.stop_reason, r.error = out.finish_reason, out.stop_reason, out.error
                    r.error_kind = out.error_kind
                    pending.discard(out.request_id)
        return results


def wait_subscribed(sub: zmq.Socket, timeout_s: float = 10.0) -> None:  # type: ignore[type-arg]
    """Until a SUB socket connected to an engine's PUB receives its first message (the engine publishes
    Stats at least every second): then its subscription has reached the publisher, and no event sent
    later is dropped. What came first (Stats) is discarded."""
    if not sub.poll(timeout_s * 1000):
        raise TimeoutError(f"nothing published within {timeout_s}s: is the SUB connected to the engine's PUB?")
    sub.recv_multipart()
