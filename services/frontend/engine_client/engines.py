"""The frontend's view of its engine ranks: handshakes, heartbeats and deadlines, latest Stats,
KV indexes, and the one pass that dispatches each step's outputs to their streams.

Slow is not dead: a rank silent past --engine-timeout takes no new requests until it speaks again, and
its running requests wait; only past --engine-dead-timeout, or when its connection closes, do they fail
(those with no output yet are placed on another rank by output processing).

Runs on the event loop; sockets live in the bridge thread.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol import (
    Abort,
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineDead,
    GenerateRequest,
    Heartbeat,
    Outputs,
    ProtocolError,
    Ready,
    Reject,
    RequestOutput,
    Stats,
    UtilityCall,
    UtilityResult,
    decode,
    encode,
    make_hello,
)
from protocol.handshake import RejectCode
from services.frontend.engine_client.bridge import (
    CONNECT_FAILED,
    CONNECTED,
    DEALER,
    DISCONNECTED,
    FLUSHED,
    SEND_FAILED,
    Bridge,
    Inbound,
)
from services.frontend.engine_client.inflight import LOST, NOT_SENT, InFlight, end_of_pass
from services.frontend.engine_client.kv_index import KVIndex

try:  # built by `pip install` where a C compiler is (setup.py); else _on_outputs loops in Python
    from services.frontend.engine_client._dispatch import dispatch
except ImportError:  # pragma: no cover - a host without the extension
    dispatch = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

HELLO_RETRY_S = 0.5
POOLING_MINOR = 5  # protocol 1.5: pooling requests, pooled outputs, Ready.runner and Ready.tasks
# The timers wake when something is due (a heartbeat to send, a deadline to judge, a handshake to
# retry), at least this often, and at once when poked (a connection made): not on a fixed fast tick,
# which would cost an idle frontend a wake-up every few tens of milliseconds.
TICK_MAX_S = 1.0
# A wake-up this late means this process itself was not running (a stall: the GIL held by a C call,
# the process stopped or starved): no engine is judged on that round, so the socket thread can
# first hand over what ZMQ's I/O thread received meanwhile. Our stall never fakes a dead engine.
STALL_S = 0.25
# A Stats snapshot may not yet count requests sent this recently before it arrived (they can still be in
# flight to the engine, or arrive after the snapshot was taken): they stay counted on top of it.
STATS_LAG_S = 0.02


class Changes:
    """A wake-up for every consumer of the engines' state (wait_ready, the gRPC health task): `wait()`
    returns an awaitable bound, when called, to the next `set()`. Nobody clears it, so no consumer can
    clear away a wake another has not yet seen, as two consumers clearing one shared asyncio.Event could."""

    def __init__(self) -> None:
        self._next = asyncio.Event()

    def set(self) -> None:
        self._next.set()
        self._next = asyncio.Event()

    def wait(self) -> Coroutine[Any, Any, bool]:
        return self._next.wait()


class KvEventSink(Protocol):
    """Where KV events go beside the engines' indexes (kv_relay.KvRelay)."""

    def event(self, rank: int, epoch: str, event: BlockStored | BlockRemoved | AllCleared) -> None: ...

    def cleared(self, rank: int, epoch: str) -> None: ...


@dataclass(slots=True, eq=False)
class Engine:
    index: int
    address: str
    rank: int
    state: str = "connecting"  # connecting | ready | dead | rejected
    reason: str = "no handshake yet"
    ready: Ready | None = None
    epoch: str = ""
    last_seen: float = 0.0
    hello_sent: float = 0.0
    last_beat: float = 0.0
    beat_seq: int = 0
    stats: Stats | None = None
    sent_since_stats: int = 0  # our requests the latest Stats may not count yet
    recent_sends: deque[float] = field(default_factory=deque)  # send times within STATS_LAG_S
    pending_prefill: int = 0  # prompt tokens of our requests that have no output yet
    inflight: dict[str, InFlight] = field(default_factory=dict)
    kv: KVIndex = field(default_factory=lambda: KVIndex(-1))
    lost: str | None = None  # its connection closed: in-flight requests fail once the sends queued are tried
    reloading: bool = False  # a new session getting this process's LoRA adapters again: no requests yet
    slow: str | None = None  # ready but silent past the short deadline (its deadlines): no new requests

    @property
    def accepting(self) -> bool:
        return (self.state == "ready" and self.slow is None and not self.reloading
                and not (self.stats is not None and self.stats.draining))

    @property
    def unavailable(self) -> str:
        """Why it takes no requests (its state's reason, unless it is ready)."""
        if self.state == "ready":
            if self.slow is not None:
                return (f"no message for {time.monotonic() - self.last_seen:.1f}s {self.slow}: takes no new "
                        f"requests; its {len(self.inflight)} running request(s) wait")
            if self.reloading:
                return "loading this frontend's LoRA adapters again after a restart"
            if self.stats is not None and self.stats.draining:
                return "draining (shutting down)"
        return self.reason

    @property
    def condition(self) -> str:
        """Its state as /ready and error messages name it: `slow: why`, `dead: why`, ..."""
        if self.state == "ready":
            if self.accepting:
                return "ready"
            label = "slow" if self.slow is not None else "reloading" if self.reloading else "draining"
            return f"{label}: {self.unavailable}"
        return f"{self.state}: {self.reason}"

    @property
    def tasks(self) -> tuple[str, ...]:
        """What its model serves, as vLLM names the tasks (Ready.tasks since protocol 1.5; an older engine
        generates); none before its handshake."""
        ready = self.ready
        if ready is None:
            return ()
        if (ready.major, ready.minor) < (1, POOLING_MINOR):
            return ("generate",)  # it would read a pooling request's fields as a generation's
        return tuple(ready.tasks) or (("generate",) if ready.runner == "generate" else ())

    @property
    def block_size(self) -> int:
        return self.ready.block_size if self.ready else 16

    @property
    def max_model_len(self) -> int:
        return self.ready.max_model_len if self.ready else 0


class EngineSet:
    def __init__(self, addresses: list[str], *, frontend_id: str, engine_timeout_s: float,
                 heartbeat_interval_s: float, auth_token: str | None = None,
                 engine_dead_timeout_s: float | None = None) -> None:
        """engine_timeout_s: silence that makes a rank slow; engine_dead_timeout_s (default: 5 times it)
        silence that makes it dead."""
        self.engines = [Engine(i, a, rank=i) for i, a in enumerate(addresses)]
        for e in self.engines:
            e.kv.rank = e.rank
        self._frontend_id = frontend_id
        self._timeout = engine_timeout_s
        self._dead_timeout = max(engine_timeout_s, engine_dead_timeout_s if engine_dead_timeout_s is not None
                                 else 5 * engine_timeout_s)
        self._beat_interval = heartbeat_interval_s
        self._auth_token = auth_token
        self._bridge: Bridge | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._calls: dict[int, asyncio.Future[UtilityResult]] = {}
        self._next_call = 0
        self.changed = Changes()  # set whenever an engine's state changes
        self._poke = asyncio.Event()  # the timers look again now
        self.broken: str | None = None  # why the socket thread stopped: the process cannot serve
        self.relay: KvEventSink | None = None  # KV events relayed on (the gRPC KvEvents service's)
        self.on_ready: list[Callable[[Engine], None]] = []  # called when a rank starts a new session

    # ---- lifecycle ----

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Idle Stats wait at most a quarter of the deadline (and half a second) before the loop sees them; a
        # process with nothing in flight reads its engines that often (bridge.py's idle_hold), so the first
        # request it places after a quiet spell sees load up to that old (those after it, fresh load).
        # The ZMQ routing id an engine keeps this process's session under: unguessable, and not the
        # frontend id (which logs and GetServerInfo show), so that no peer without the token can claim it
        # first (a ROUTER ignores a second connection with a known id: the frontend would be shut out) or
        # step into the session between this process's reconnects.
        routing_id = "fe-" + secrets.token_hex(16)
        self._bridge = Bridge(loop, self._on_batch, routing_id, on_dead=self._on_bridge_dead,
                              hold_stats_s=min(0.5, self._timeout / 4))
        for e in self.engines:
            self._bridge.connect(e.index, e.address)
        self._ticker = loop.create_task(self._tick())
        self._ticker.add_done_callback(self._on_ticker_done)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for e in self.engines:
            self._fail_all(e, "frontend shutting down", movable=False)
        if self._bridge is not None:
            await asyncio.to_thread(self._bridge.close)

    def all_ready(self) -> bool:
        return all(e.state == "ready" for e in self.engines)

    def not_ready(self) -> dict[int, str]:
        """The ranks that take no new requests, and why (`slow: ...`, `dead: ...`, `connecting: ...`)."""
        return {e.rank: e.condition for e in self.engines if not e.accepting}

    def tasks(self) -> list[str] | None:
        """The tasks the handshaken ranks serve, in the order they name them; None while none has
        handshaken (nothing is known yet)."""
        ready = [e for e in self.engines if e.ready is not None]
        if not ready:
            return None
        return list(dict.fromkeys(t for e in ready for t in e.tasks))

    def serving(self) -> list[int]:
        """The ranks that take new requests: the process can serve while there is one (/ready)."""
        return [e.rank for e in self.engines if e.accepting]

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.all_ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"engines not ready after {timeout_s:.0f}s: {self.not_ready()}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    # ---- requests ----

    def submit(self, engine: Engine, stream: InFlight, request: GenerateRequest) -> None:
        assert self._bridge is not None
        frames = encode(request)  # first: if it cannot be encoded, no state has changed
        stream.rank, stream.engine_index = engine.rank, engine.index
        engine.inflight[stream.request_id] = stream
        engine.sent_since_stats += 1
        now = time.monotonic()
        recent = engine.recent_sends
        while recent and recent[0] < now - STATS_LAG_S:
            recent.popleft()
        recent.append(now)
        engine.pending_prefill += stream.prompt_len
        self._bridge.quiet = False  # before the send: its outputs are read as they come
        self._bridge.send(engine.index, frames)

    def abort(self, stream: InFlight) -> None:
        """Stop a request at its engine (client gone, stop string matched)."""
        if stream.engine_index < 0:
            return
        engine = self.engines[stream.engine_index]
        if engine.inflight.pop(stream.request_id, None) is None:
            return
        self._finished(engine, stream)
        if self._bridge is not None and engine.state == "ready":
            self._bridge.send(engine.index, encode(Abort([stream.request_id])))

    @property
    def frontend_id(self) -> str:
        return self._frontend_id

    async def utility(self, rank: int, utility: str, args: dict[str, Any] | None = None, timeout_s: float = 10.0,
                      frames: Sequence[bytes] = ()) -> UtilityResult:
        """An allowlisted utility call on engine `rank` (an index into `engines`); `frames` travel as the
        message's raw frames (a weight update's tensors)."""
        assert self._bridge is not None
        self._next_call += 1
        call_id = self._next_call
        future: asyncio.Future[UtilityResult] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._bridge.quiet = False
        self._bridge.send(self.engines[rank].index, encode(UtilityCall(call_id, utility, args or {}), *frames))
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._calls.pop(call_id, None)

    def _finished(self, engine: Engine, stream: InFlight) -> None:
        if not stream.started:
            stream.started = True
            engine.pending_prefill -= stream.prompt_len

    # ---- inbound: one pass over each batch from the socket thread ----

    def _on_batch(self, batch: list[Inbound], received_at: float | None = None) -> None:
        try:
            self._take(batch, received_at)
        finally:
            end_of_pass()  # streams written from this pass write now, each once
            self._hint_quiet()

    def _hint_quiet(self) -> None:
        """Tell the socket thread whether a reply could be on its way (bridge.py's idle_hold)."""
        if self._bridge is not None:
            self._bridge.quiet = not self._calls and all(e.state == "ready" and not e.inflight for e in self.engines)

    def _take(self, batch: list[Inbound], received_at: float | None) -> None:
        now = time.monotonic() if received_at is None else received_at  # when the socket thread read it
        for index, channel, frames in batch:
            engine = self.engines[index]
            if channel == CONNECT_FAILED:
                log.error("engine rank %d: %s", engine.rank, frames[0])
                self._fail_all(engine, frames[0])
                engine.state, engine.reason = "rejected", frames[0]  # an address that cannot work: no retries
                self.changed.set()
                continue
            if channel == DISCONNECTED:
                self._link_lost(engine, "its connection closed (the engine process exited or closed its socket)")
                continue
            if channel == FLUSHED:
                if engine.lost is not None:
                    self._fail_all(engine, f"engine rank {engine.rank} failed: {engine.lost}")
                    engine.lost = None
                continue
            if channel == CONNECTED:
                if engine.state in ("connecting", "dead"):
                    engine.hello_sent = 0.0  # handshake now, not at the next retry
                    self._poke.set()
                continue
            try:
                msg = decode(frames, any_major=channel == DEALER)
            except ProtocolError as exc:
                log.warning("rank %d: undecodable message: %s", engine.rank, exc)
                continue
            if channel == SEND_FAILED:
                self._on_send_failed(engine, msg)
                continue
            if channel == DEALER:
                if engine.slow is not None:
                    self._speaks_again(engine, now - engine.last_seen)
                engine.last_seen = now
            if isinstance(msg, Outputs):
                self._on_outputs(engine, msg, frames[2:] if len(frames) > 2 else ())
            elif isinstance(msg, Stats):
                self._on_stats(engine, msg, now)
            elif isinstance(msg, (BlockStored, BlockRemoved, AllCleared)):
                if engine.state == "ready":
                    gap = engine.kv.apply(msg)
                    if self.relay is not None:
                        if gap:
                            self.relay.cleared(engine.rank, engine.epoch)
                        self.relay.event(engine.rank, engine.epoch, msg)
            elif isinstance(msg, Ready):
                self._on_ready(engine, msg, now)
            elif isinstance(msg, Reject):
                self._on_reject(engine, msg)
            elif isinstance(msg, EngineDead):
                self._mark_dead(engine, f"engine reported it is dead: {msg.reason}")
            elif isinstance(msg, UtilityResult):
                future = self._calls.get(msg.call_id)
                if future is not None and not future.done():
                    future.set_result(msg)

    def _on_outputs(self, engine: Engine, msg: Outputs, raw_frames: Sequence[bytes] = ()) -> None:
        """`raw_frames`: the message's frames after its body (packed logprobs)."""
        inflight = engine.inflight
        now = time.monotonic()  # one reading for the message's plain steps (a step's outputs came together)
        if dispatch is not None:  # the loop below in C; what no plain step took comes back, in order
            left = dispatch(msg.outputs, inflight, raw_frames, now)
            if left is None:
                return
        else:
            left = []
            for out in msg.outputs:
                stream = inflight.get(out.request_id)
                if stream is None:
                    continue  # aborted by us meanwhile
                plain = stream.plain
                if plain is not None and plain(out, raw_frames, now):
                    continue  # a plain step its sink took whole (InFlight.plain): nearly every token of a stream
                left.append((stream, out))
        for stream, out in left:  # queued on their streams
            if not stream.started:
                stream.started = True
                engine.pending_prefill -= stream.prompt_len
            if out.finish_reason is not None:
                del inflight[out.request_id]
            stream.feed(out, raw_frames)

    def _on_stats(self, engine: Engine, msg: Stats, received_at: float | None = None) -> None:
        current = engine.stats
        # Stats come direct (the PUB's copies are not subscribed to: bridge.py); the latest by sequence
        # number within one engine session counts, whatever the order they are read in.
        if msg.session_epoch != engine.epoch:
            return
        if current is None or msg.seq > current.seq:
            engine.stats = msg
            # Not 0: a snapshot taken before our latest requests reached the engine would otherwise
            # make it look idle, and a burst would all be placed on it.
            received = time.monotonic() if received_at is None else received_at
            recent, cutoff = engine.recent_sends, received - STATS_LAG_S
            while recent and recent[0] < cutoff:
                recent.popleft()
            engine.sent_since_stats = len(recent)

    def _on_ready(self, engine: Engine, msg: Ready, now: float) -> None:
        if engine.state == "ready" and msg.session_epoch == engine.epoch:
            return  # an answer to a duplicate Hello
        if engine.inflight:
            self._fail_all(engine, f"engine rank {engine.rank} restarted (new session)")
        clash = next((e for e in self.engines if e is not engine and e.ready is not None and e.rank == msg.rank), None)
        if clash is not None:
            log.warning("engines %s and %s both report rank %d: pins and logs by rank are ambiguous "
                        "(start them with distinct --data-parallel-start-rank)", clash.address, engine.address,
                        msg.rank)
        engine.rank = msg.rank
        engine.kv.rank = msg.rank
        engine.ready, engine.epoch, engine.state, engine.reason = msg, msg.session_epoch, "ready", "ready"
        engine.lost, engine.reloading, engine.slow = None, False, None
        engine.stats, engine.sent_since_stats, engine.pending_prefill, engine.last_seen = None, 0, 0, now
        engine.recent_sends.clear()
        engine.kv.reset()
        if self.relay is not None:
            self.relay.cleared(engine.rank, engine.epoch)  # a new session holds nothing yet
        host = engine.address.rsplit(":", 1)[0]
        if msg.pub_port and self._bridge is not None:
            self._bridge.subscribe(engine.index, f"{host}:{msg.pub_port}")
        for joined in self.on_ready:
            joined(engine)
        log.info("engine rank %d joined: %s backend=%s model=%s max_model_len=%d block_size=%d epoch=%s "
                 "(protocol %d.%d)", msg.rank, engine.address, msg.backend, msg.model, msg.max_model_len,
                 msg.block_size, msg.session_epoch, msg.major, msg.minor)
        self.changed.set()

    def _on_reject(self, engine: Engine, msg: Reject) -> None:
        if msg.code == RejectCode.EXPIRED.value or msg.code == RejectCode.MALFORMED.value:
            # Our session there is gone (we were silent, or it restarted between beats): start again.
            self._fail_all(engine, f"engine rank {engine.rank} dropped this frontend's session: {msg.reason}")
            engine.state, engine.reason, engine.hello_sent = "connecting", msg.reason, 0.0
        else:
            log.error("engine rank %d refused the handshake (%s): %s", engine.rank, msg.code, msg.reason)
            engine.state, engine.reason = ("rejected" if msg.code == RejectCode.VERSION.value
                                           else "connecting"), f"{msg.code}: {msg.reason}"
        self.changed.set()

    def _on_send_failed(self, engine: Engine, msg: Any) -> None:
        """The DEALER refused these frames: no connection, so they never left this process."""
        self._link_lost(engine, "a send found no connection to it")
        if isinstance(msg, GenerateRequest):
            stream = engine.inflight.pop(msg.request_id, None)
            if stream is not None:
                self._finished(engine, stream)
                # Output processing places it on another rank (unless pinned, or the client left).
                stream.feed(RequestOutput(msg.request_id, [], "error", error=f"engine rank {engine.rank} is "
                                          "unreachable (the request was never sent)", error_kind=NOT_SENT))
        elif isinstance(msg, UtilityCall):
            future = self._calls.get(msg.call_id)
            if future is not None and not future.done():
                future.set_result(UtilityResult(msg.call_id, False, None, f"engine rank {engine.rank} is unreachable"))

    def _link_lost(self, engine: Engine, reason: str) -> None:
        """The connection to a ready engine is gone: stop placing requests on it now. Requests already
        sent may have reached it (their outputs cannot arrive any more): they fail once every send
        queued to it has been tried, so that one refused for want of the connection is placed again."""
        if engine.state != "ready":
            return
        self._mark_dead(engine, reason, fail=False)
        engine.lost = reason
        if self._bridge is not None:
            self._bridge.flush(engine.index)

    def _on_bridge_dead(self, reason: str) -> None:
        """No engine can be reached any more: fail everything in flight at once, not by deadline."""
        self._give_up(f"the frontend's engine socket thread stopped: {reason}")

    def _on_ticker_done(self, task: asyncio.Task[None]) -> None:
        """The timers' task ended other than by close(): a bug. Without it no handshake is retried and no
        heartbeat sent, so an engine that restarts is never taken back: said, and given up as a dead socket
        thread is (the server exits for a restart), not left to look alive."""
        if task.cancelled() or (exc := task.exception()) is None:
            return
        log.error("the engine timers stopped", exc_info=exc)
        self._give_up(f"the frontend's engine timers stopped: {exc!r}")

    def _give_up(self, why: str) -> None:
        self.broken = why
        for e in self.engines:
            self._mark_dead(e, self.broken, fail=False)
            # One already down awaits no flush; no rank is left to move a request to.
            self._fail_all(e, f"engine rank {e.rank} failed: {self.broken}", movable=False)
        self.changed.set()

    def _mark_slow(self, engine: Engine) -> None:
        """Silent past the short deadline: no new requests; its running ones wait for the long one."""
        engine.slow = f"(--engine-timeout {self._timeout:g}s, --engine-dead-timeout {self._dead_timeout:g}s)"
        log.warning("engine rank %d is slow: %s", engine.rank, engine.unavailable)
        self.changed.set()

    def _speaks_again(self, engine: Engine, silent: float) -> None:
        log.info("engine rank %d speaks again after %.1fs of silence: taking new requests (its %d running "
                 "request(s) continue)", engine.rank, silent, len(engine.inflight))
        engine.slow = None
        self.changed.set()

    def _mark_dead(self, engine: Engine, reason: str, *, fail: bool = True) -> None:
        if engine.state == "dead":
            return
        log.error("engine rank %d is dead: %s", engine.rank, reason)
        if self.relay is not None and engine.epoch:
            self.relay.cleared(engine.rank, engine.epoch)
        engine.state, engine.reason, engine.hello_sent, engine.epoch = "dead", reason, 0.0, ""
        engine.slow = None
        engine.kv.reset()
        if fail:
            self._fail_all(engine, f"engine rank {engine.rank} failed: {reason}")
        self.changed.set()

    def _fail_all(self, engine: Engine, reason: str, *, movable: bool = True) -> None:
        """End the rank's in-flight requests. With `movable`, one that has no output yet is told so
        (error_kind LOST) rather than failed: output processing may place it on another rank, as
        nothing of it reached its client."""
        streams = list(engine.inflight.values())
        engine.inflight.clear()
        engine.pending_prefill = 0
        for stream in streams:
            if movable and not stream.started:
                stream.feed(RequestOutput(stream.request_id, [], "error", error=reason, error_kind=LOST))
            else:
                stream.fail(reason)

    # ---- timers: handshake retries, heartbeats, deadlines ----

    async def _tick(self) -> None:
        hello = encode(make_hello(self._frontend_id, self._auth_token))
        stalled, late = False, 0.0
        while True:
            now = time.monotonic()
            if stalled:
                log.warning("this API server did not run for %.2fs past a timer; no engine is judged on that gap",
                            late)
            due = now + TICK_MAX_S
            bridge = self._bridge
            assert bridge is not None
            for e in self.engines:
                if e.state == "ready":
                    silent = now - e.last_seen
                    if silent > self._dead_timeout and not stalled:
                        self._mark_dead(e, f"no message for {silent:.1f}s (--engine-dead-timeout "
                                           f"{self._dead_timeout:g}s)")
                        continue
                    if silent > self._timeout and e.slow is None and not stalled:
                        self._mark_slow(e)
                    if now - e.last_beat >= self._beat_interval:
                        e.beat_seq += 1
                        e.last_beat = now
                        bridge.send(e.index, encode(Heartbeat(e.beat_seq, time.time())))
                    deadline = self._timeout if e.slow is None else self._dead_timeout
                    due = min(due, e.last_seen + deadline, e.last_beat + self._beat_interval)
                elif e.state != "rejected":
                    if now - e.hello_sent >= HELLO_RETRY_S:
                        e.hello_sent = now
                        bridge.send(e.index, hello)
                    due = min(due, e.hello_sent + HELLO_RETRY_S)
            self._hint_quiet()
            delay = max(due - now, 0.0) + 0.001
            if stalled:  # give the socket thread time to hand over what came meanwhile before judging again
                delay = max(delay, STALL_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), delay)
            self._poke.clear()
            late = time.monotonic() - now - delay
            stalled = late > STALL_S

