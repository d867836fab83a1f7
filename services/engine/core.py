"""The engine core loop (one per rank process): owns peers and request state and steps the backend.

It never touches a socket: input arrives on the bridge's inbox, output leaves through the bridge.
Each step's outputs are walked once, grouped per peer, and sent as one Outputs message per peer.
"""
from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import zmq

import tracing
from protocol import (
    ERROR_DRAINING,
    ERROR_ENGINE,
    ERROR_INVALID,
    Abort,
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineDead,
    Frames,
    GenerateRequest,
    Heartbeat,
    Hello,
    Message,
    Outputs,
    ProtocolError,
    Ready,
    Reject,
    RejectCode,
    RequestOutput,
    Stats,
    UtilityCall,
    UtilityResult,
    check_hello,
    decode,
    encode,
    peek_header,
)
from protocol.handshake import version_reject
from protocol.logprobs import Buffer, segment_size
from protocol.version import MAJOR, MINOR
from services.engine import request_trace, utility, validation
from services.engine.backend import (
    Backend,
    Cleared,
    KVEvent,
    Load,
    ModelBroken,
    Pooled,
    Removed,
    RequestRejected,
    Segment,
    Stored,
)
from services.engine.bridge import Bridge
from services.engine.config import EngineConfig
from services.engine.peers import Peer, Peers
from services.engine.request_trace import EngineTrace
from services.engine.token_histogram import TokenHistogram

log = logging.getLogger(__name__)

PUB_STATS_IDLE_S = 1.0  # the longest a rank's PUB goes without a Stats
# A repeated Hello of a session that has said nothing since its Ready, within this long of it, is one of
# the retries that queued while this rank loaded: dropped. Later it is answered with the same Ready (the
# first may not have arrived), still one session.
DUPLICATE_HELLO_S = 1.0
TOLD_MAX = 4096  # (peer, what) pairs remembered for log-once; forgotten all at once past this


class CoreLoop:
    def __init__(
        self,
        config: EngineConfig,
        backend: Backend,
        bridge: Bridge,
        *,
        vocab_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.backend = backend
        self.bridge = bridge
        self.rank = config.rank
        self.epoch = uuid.uuid4().hex[:12]
        self._vocab_size = vocab_size
        self._clock = clock
        self._peers = Peers()
        # Pause: the mode asked ("keep", "abort", "wait") while paused or pausing, else None. "wait" pauses
        # once nothing is in flight; its calls are answered then. Requests that arrive meanwhile are held
        # here (owned by their peer, not given to the backend) and added on resume, in arrival order.
        self._pause_mode: str | None = None
        self._pause_calls: list[tuple[bytes, int]] = []  # pending "wait" pauses: identity, call_id
        self._held: dict[str, GenerateRequest] = {}
        # The peer that started the open weight update (None: none is open); on a backend whose model
        # cannot run meanwhile no step runs (_busy).
        self._updater: bytes | None = None
        self._update_seen = 0.0  # the open update's last start or update_weights call (the loop's clock)
        self._drain_requested = False  # set from the signal handler; read by the loop
        self._drain_deadline: float | None = None
        self._step = 0
        self._stats_seq = 0
        self._published: tuple[Any, ...] | None = None  # the load the latest Stats on PUB told
        self._published_at = 0.0
        self._kv_seq = 0
        # Messages to send with the step's outputs (a heartbeat's Stats due during the step); None: send at once.
        self._riders: list[tuple[bytes, Frames]] | None = None
        self._iteration_tokens = TokenHistogram()
        self._told: set[tuple[bytes, str]] = set()  # what was logged about a peer without a session
        # Spans of the traced requests in flight (tracing on and the request carries a trace context).
        self._traces: dict[str, EngineTrace] = {}

    # ---- lifecycle -----------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Safe from a signal handler: only sets a flag the loop reads."""
        self._drain_requested = True

    def run(self) -> int:
        """Serve until drained (exit code 0) or the backend fails (EngineDead sent, exit code 1)."""
        interval = self.config.heartbeat_interval_s
        next_beat = self._clock()
        try:
            while True:
                self.bridge.loop_alive_at = self._clock()
                # 1. Take input: block until the next heartbeat when idle, else only drain.
                busy = self._busy()
                self._take_input(0.0 if busy else max(0.0, next_beat - self._clock()))
                now = self._clock()
                # 2. Heartbeats out, silent peers reaped, drain progress.
                if now >= next_beat:
                    next_beat = self._beat(now, next_beat, interval)
                if self._drain_requested and self._drain_deadline is None:
                    self._start_drain(now)
                if self._drain_deadline is not None and self._drain_finished(now, self._drain_deadline):
                    return 0
                # 3. One engine step, its outputs delivered when its (simulated) time is up.
                if self._busy():
                    t0 = self._clock()
                    result = self.backend.step()
                    if result.duration_s > 0:
                        self._take_input_until(t0 + result.duration_s)
                    if result.outputs:  # as vLLM: a step without outputs is not observed
                        self._iteration_tokens.observe(result.num_tokens)
                    # A heartbeat that fell due during the step leaves with its outputs, in one send: a
                    # frontend then reads the step's outputs and the Stats in one wake-up, not two.
                    now = self._clock()
                    if now >= next_beat:
                        self._take_input(0.0)  # as at the loop's top: no peer judged silent on unread input
                        self._riders = []
                        next_beat = self._beat(now, next_beat, interval)
                    self._deliver(result.outputs, result.segments, result.pooled)
                    if result.kv_events:
                        self._publish_kv(result.kv_events)
                if self._pause_calls and self._drained():
                    self._answer_pause_calls()
        except Exception as exc:  # the backend failed: tell every peer before the process exits
            log.exception("engine rank %d failed", self.rank)
            self._broadcast(EngineDead(self.rank, f"engine rank {self.rank} failed: {exc!r}"))
            return 1
        finally:
            for trace in self._traces.values():
                trace.end("abort", "the engine stopped")
            self._traces.clear()
            self.backend.shutdown()

    def _busy(self) -> bool:
        return self._pause_mode in (None, "wait") and not self._holding_for_weights() and self.backend.has_work()

    def _holding_for_weights(self) -> bool:
        """No step while a weight update is open on a backend whose model cannot run then (the vllm
        backend: its layers are on the meta device from start to finish). vLLM's contract is pause,
        update, resume, and it leaves the order to its caller: a step in between would crash the rank or
        sample from half-loaded weights. Here such a step waits instead, whatever the pause says: running
        requests and new ones stay queued, their streams quiet, until finish_weight_update. Nothing is
        refused but what could never finish: a pause(mode='wait') meanwhile. An update whose client leaves
        (its connection closes, or it falls silent) fails the rank (_abandoned_update), and a drain ends
        the held requests at once."""
        return self._updater is not None and not self.backend.info.runs_during_weight_update

    def _expire_update(self, now: float) -> None:
        """An open update that no call has touched for --weight-update-timeout is abandoned (its client went
        away between calls, as a trainer that crashed between UpdateWeights and FinishWeightUpdate)."""
        if self._holding_for_weights() and now - self._update_seen > self.config.weight_update_timeout_s:
            raise ModelBroken(f"the weight update had no call for {now - self._update_seen:.0f}s "
                              f"(--weight-update-timeout {self.config.weight_update_timeout_s:g}s); the model is "
                              "half-loaded")

    def _abandoned_update(self, peer: Peer) -> None:
        """The peer that started an open update left. Where the model cannot run until it finishes, its
        weights are half-loaded and nobody will finish them: the rank fails, so its supervisor starts it
        again from the checkpoint (the sim keeps serving; another peer may finish its update)."""
        if self._updater == peer.identity and self._holding_for_weights():
            raise ModelBroken(f"the weight update's client (frontend {peer.frontend_id}) left before "
                              "finish_weight_update; the model is half-loaded")

    def _start_drain(self, now: float) -> None:
        self._drain_deadline = now + self.config.drain_timeout_s
        if self._held:  # never given to the backend: another rank can serve them
            held, self._held = list(self._held), {}
            self._fail(held, f"engine rank {self.rank} is draining (shutting down) while paused; "
                             "send it to another rank", ERROR_DRAINING)
        log.info("rank %d draining: %d request(s) in flight, deadline %.1fs",
                 self.rank, self._peers.in_flight(), self.config.drain_timeout_s)
        self._heartbeat(now)  # tell peers at once (Stats.draining) rather than at the next beat

    def _drain_finished(self, now: float, deadline: float) -> bool:
        if self._peers.in_flight() and now < deadline and not self._holding_for_weights():
            return False  # (held for weights, nothing can finish: they end now)
        left = self._peers.all_requests()
        if left:
            log.warning("rank %d drain deadline passed; failing %d request(s)", self.rank, len(left))
            for internal in left:
                entry = self._peers.owner(internal)
                if entry is not None:
                    self._log_aborted(entry[0], [internal], "the drain deadline passed")
            self._abort_owned(left)
            # Draining: a request with nothing generated yet can still be served by another rank.
            self._fail(left, f"engine rank {self.rank} shut down (drain deadline "
                             f"{self.config.drain_timeout_s}s) before the request finished", ERROR_DRAINING)
        self._broadcast(EngineDead(self.rank, f"engine rank {self.rank} stopped (drained)"))
        log.info("rank %d drained; exiting", self.rank)
        return True

    # ---- input ---------------------------------------------------------------------------------

    def _take_input(self, timeout: float) -> None:
        inbox = self.bridge.inbox
        try:
            item = inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._on_frames(*item)
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                return

    def _take_input_until(self, deadline: float) -> None:
        while (left := deadline - self._clock()) > 0:
            self._take_input(left)

    def _on_frames(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        now = self._clock()
        if not frames:
            self._on_closed(identity)
            return
        raw = [f.buffer for f in frames]
        try:
            major, minor, tag = peek_header(raw[0])
            if tag == Hello.TAG:
                self._on_hello(identity, raw, major, minor, now)
                return
            peer = self._peers.get(identity)
            if peer is None:
                self._refuse_sessionless(identity, tag)
                return
            peer.last_seen = now
            peer.spoke = True
            self._on_message(peer, decode(raw), raw[2:])
        except ProtocolError as exc:
            log.warning("rank %d: undecodable message from peer %r: %s", self.rank, identity, exc)

    def _refuse_sessionless(self, identity: bytes, tag: int) -> None:
        """A message other than Hello from a peer with no session (never handshaken, refused, or expired):
        nothing is done, and the peer is told why; logged once per peer."""
        if tag == Heartbeat.TAG:
            return  # a beat racing its own Hello, or from an expired session (already told)
        self._send(identity, Reject(RejectCode.MALFORMED.value, (
            "no session on this connection: send Hello (with the engine's auth token, if it asks one) and "
            "wait for Ready; this message was refused and changed nothing")))
        self._log_once(identity, "sessionless", logging.WARNING, "rank %d refused messages from %r, which has no "
                       "session (no accepted Hello): nothing they ask is done", self.rank, identity)

    def _log_once(self, identity: bytes, what: str, level: int, fmt: str, *args: object) -> None:
        """Log a peer's repeated event (a refusal it keeps retrying) only the first time."""
        if (identity, what) in self._told:
            return
        if len(self._told) >= TOLD_MAX:
            self._told.clear()
        self._told.add((identity, what))
        log.log(level, fmt, *args)

    def _on_closed(self, identity: bytes) -> None:
        """The peer's connection closed (the bridge's send found none): its requests are aborted now,
        not at --client-timeout. A frontend that is still alive connects again and sends Hello."""
        peer = self._peers.get(identity)
        if peer is None:
            return
        self._abandoned_update(peer)
        orphans = self._peers.leave(peer)
        self.bridge.peers = tuple(p.identity for p in self._peers)
        log.log(logging.WARNING if orphans else logging.INFO, "rank %d: frontend %s closed its connection; "
                "aborting its %d request(s)", self.rank, peer.frontend_id, len(orphans))
        if orphans:
            self._abort_owned(orphans)
            self._log_aborted(peer, orphans, "its frontend's connection closed")

    def _on_hello(self, identity: bytes, raw: list[Any], major: int, minor: int, now: float) -> None:
        if major != MAJOR:
            refusal = version_reject(major, minor)
            log.warning("rank %d refused handshake from %r: %s", self.rank, identity, refusal.reason)
            self._send(identity, refusal)
            return
        try:
            hello = decode(raw)
        except ProtocolError as exc:
            self._send(identity, Reject(RejectCode.MALFORMED.value, f"unreadable Hello: {exc}"))
            raise
        assert isinstance(hello, Hello)
        reject = check_hello(hello, auth_token=self.config.auth_token,
                             draining=self._drain_deadline is not None)
        if reject is not None:
            self._log_once(identity, f"hello:{reject.code}", logging.WARNING,
                           "rank %d refused handshake from %s (protocol %d.%d): %s", self.rank, hello.frontend_id,
                           hello.major, hello.minor, reject.reason)
            self._send(identity, reject)
            return
        old = self._peers.get(identity)
        if old is not None and old.frontend_id == hello.frontend_id and not old.spoke:
            # The same session's Hello again, before the peer said anything else: a retry (one per
            # HELLO_RETRY_S queues up while this rank loads). One Ready per session, one log line.
            if now - old.last_seen >= DUPLICATE_HELLO_S:
                old.last_seen = now
                self._send(identity, self._ready())
            return
        self._told = {t for t in self._told if t[0] != identity}  # a new session: its refusals may be told again
        if old is not None:  # the same connection handshook again: its earlier session is over
            orphans = self._peers.leave(old)
            self._abort_owned(orphans)
            self.bridge.peers = tuple(p.identity for p in self._peers)
            self._log_aborted(old, orphans, "its frontend started a new session")
        self._peers.join(identity, hello.frontend_id, now)
        self.bridge.peers = tuple(p.identity for p in self._peers)
        log.info("rank %d accepted frontend %s (protocol %d.%d, fingerprint %s; engine %d.%d)",
                 self.rank, hello.frontend_id, hello.major, hello.minor, hello.schema_fingerprint,
                 MAJOR, MINOR)
        self._send(identity, self._ready())

    def _ready(self) -> Ready:
        info = self.backend.info
        return Ready(self.rank, info.model, info.max_model_len, info.block_size, info.num_kv_blocks,
                     info.name, info.version, self.epoch, self.bridge.pub_port, MAJOR, MINOR, info.runner,
                     list(info.tasks))

    def _on_message(self, peer: Peer, msg: Message, frames: Sequence[Buffer] = ()) -> None:
        if isinstance(msg, GenerateRequest):
            self._on_generate(peer, msg)
        elif isinstance(msg, Abort):
            self._on_abort(peer, msg)
        elif isinstance(msg, Heartbeat):
            pass  # last_seen is already updated
        elif isinstance(msg, UtilityCall):
            result = self._on_utility(peer, msg, frames)
            if result is not None:
                self._send(peer.identity, result)
        else:
            log.warning("rank %d: unexpected %s from %s", self.rank, type(msg).__name__,
                        peer.frontend_id)

    def _on_generate(self, peer: Peer, req: GenerateRequest) -> None:
        internal = self._peers.internal_id(peer, req.request_id)
        error: str | None
        kind = ERROR_INVALID
        if self._drain_deadline is not None:
            error = f"engine rank {self.rank} is draining (shutting down); send it to another rank"
            kind = ERROR_DRAINING
        elif self._peers.owner(internal) is not None:
            error = f"request_id {req.request_id!r} is already in flight on this engine"
        else:
            error = validation.problem(req, vocab_size=self._vocab_size,
                                       max_model_len=self.backend.info.max_model_len,
                                       max_logprobs=self.config.max_logprobs, tasks=self.backend.info.tasks)
        traced = req.trace_headers is not None and tracing.enabled()
        if error is None and self._pause_mode is not None:
            self._held[internal] = req
            self._peers.own(peer, internal, req.request_id)
            if traced:
                self._start_trace(internal, req)
            return
        if error is None:
            error, kind = self._add(internal, req)
        if error is None:
            self._peers.own(peer, internal, req.request_id)
            if traced:
                self._start_trace(internal, req)
        else:
            if traced:
                request_trace.refused(req, self.rank, error)
            self._send_outputs(peer, [RequestOutput(req.request_id, [], "error", error=error, error_kind=kind)])

    def _start_trace(self, internal: str, req: GenerateRequest) -> None:
        trace = EngineTrace.start(req, self.rank)
        if trace is not None:
            self._traces[internal] = trace

    def _end_trace(self, internal: str, reason: str, error: str | None = None) -> None:
        trace = self._traces.pop(internal, None)
        if trace is not None:
            trace.end(reason, error)

    def _end_untracked_traces(self) -> None:
        """Spans of requests released on a path that does not end them (a pause's abort, a vanished
        peer's orphans): ended at the next heartbeat."""
        owner = self._peers.owner
        for internal in [i for i in self._traces if owner(i) is None]:
            self._end_trace(internal, "abort")

    def _add(self, internal: str, req: GenerateRequest) -> tuple[str | None, str]:
        """Give a request to the backend: (None, "") or (the error its client gets, its kind)."""
        try:
            self.backend.add(internal, req)
        except RequestRejected as exc:
            return str(exc), ERROR_INVALID
        except Exception as exc:  # one request's bad input must never take the rank down
            log.warning("rank %d: backend refused request %s: %r", self.rank, req.request_id, exc)
            return f"the engine refused the request: {exc}", ERROR_ENGINE
        return None, ""

    def _abort_owned(self, internal_ids: list[str]) -> None:
        """Abort requests a peer owns: held ones are only forgotten, the rest go to the backend."""
        if self._held:
            internal_ids = [i for i in internal_ids if self._held.pop(i, None) is None]
        if internal_ids:
            self.backend.abort(internal_ids)

    def _on_abort(self, peer: Peer, msg: Abort) -> None:
        internal = [self._peers.internal_id(peer, rid) for rid in msg.request_ids]
        known = [i for i in internal if self._peers.owner(i) is not None]
        if known:
            self._abort_owned(known)
            # The backend emits nothing for aborted requests; the finish comes from here.
            outs = []
            for i in known:
                released = self._peers.release(i)
                assert released is not None  # known: every one has an owner
                outs.append(RequestOutput(released[1], [], "abort"))
                if self._traces:
                    self._end_trace(i, "abort")
            self._send_outputs(peer, outs)
            self._log_aborted(peer, known, "the frontend aborted it")

    def _on_utility(self, peer: Peer, call: UtilityCall, frames: Sequence[Buffer]) -> UtilityResult | None:
        """The call's result, or None when it is answered later (a "wait" pause, once drained)."""
        try:
            args = utility.check(call.name, call.args)
            if call.name == "pause":
                if args["mode"] == "wait" and self._holding_for_weights():
                    raise utility.UtilityError(
                        "pause(mode='wait') cannot finish while a weight update is open on this backend: no step "
                        "runs until finish_weight_update, so the running requests cannot end; pause with mode "
                        "'keep' or 'abort', or pause before start_weight_update")
                return self._pause(peer, call.call_id, args["mode"])
            if call.name == "resume":
                self._resume()
                return UtilityResult(call.call_id, True, True)
            if call.name == "is_paused":
                return UtilityResult(call.call_id, True, {"paused": self._is_paused(), "mode": self._pause_mode,
                                                          "held": len(self._held)})
            if call.name == "stats":
                return UtilityResult(call.call_id, True, self._stats_dict())
            result = self.backend.utility(call.name, args, frames)
            if call.name in ("start_weight_update", "finish_weight_update"):
                self._updater = peer.identity if call.name == "start_weight_update" else None
            if call.name in ("start_weight_update", "update_weights"):
                self._update_seen = self._clock()
            return UtilityResult(call.call_id, True, result)
        except ModelBroken:
            raise  # the rank fails (run's handler): its model cannot serve
        except Exception as exc:  # an error result, never a crash of the engine
            log.warning("rank %d utility %s failed: %s", self.rank, call.name, exc)
            return UtilityResult(call.call_id, False, None, f"{type(exc).__name__}: {exc}")

    # ---- pause ---------------------------------------------------------------------------------

    def _pause(self, peer: Peer, call_id: int, mode: str) -> UtilityResult | None:
        """keep: freeze in place; abort: end every peer's running requests ("abort"), then freeze; wait:
        admit nothing new, step the running ones, answer once none is left. Held requests stay held."""
        self._pause_mode = mode
        aborted = 0
        if mode == "abort":
            for other in self._peers:
                running = [i for i in other.requests if i not in self._held]
                if running:
                    aborted += len(running)
                    self.backend.abort(running)
                    self._send_outputs(other, [RequestOutput(self._release(i), [], "abort") for i in running])
                    self._log_aborted(other, running, "the engine was paused with mode 'abort'")
        log.info("rank %d pausing (mode %s): %d request(s) aborted, %d running, %d held", self.rank, mode,
                 aborted, self._peers.in_flight() - len(self._held), len(self._held))
        if mode == "wait" and not self._drained():
            self._pause_calls.append((peer.identity, call_id))
            return None
        if self._pause_calls and self._drained():  # an abort ended what earlier "wait" calls waited for
            self._answer_pause_calls()
        return UtilityResult(call_id, True, {"paused": True, "mode": mode, "aborted": aborted})

    def _drained(self) -> bool:
        """Nothing in flight but the held requests."""
        return self._peers.in_flight() == len(self._held)

    def _is_paused(self) -> bool:
        return self._pause_mode is not None and (self._pause_mode != "wait" or self._drained())

    def _answer_pause_calls(self) -> None:
        calls, self._pause_calls = self._pause_calls, []
        for identity, call_id in calls:
            self._send(identity, UtilityResult(call_id, True, {"paused": True, "mode": "wait", "aborted": 0}))

    def _resume(self) -> None:
        calls, self._pause_calls = self._pause_calls, []
        for identity, call_id in calls:
            self._send(identity, UtilityResult(call_id, False, None, "UtilityError: pause(mode='wait') was "
                                               "cancelled by resume before the in-flight requests finished"))
        self._pause_mode = None
        held, self._held = self._held, {}
        if held:
            log.info("rank %d resumed: adding %d held request(s)", self.rank, len(held))
        for internal, req in held.items():
            error, kind = self._add(internal, req)
            if error is not None:
                entry = self._peers.release(internal)
                assert entry is not None  # a held request is owned until it is added or aborted
                self._send_outputs(entry[0], [RequestOutput(req.request_id, [], "error", error=error,
                                                            error_kind=kind)])

    def _release(self, internal: str) -> str:
        """Forget an owned request; its client's request id."""
        entry = self._peers.release(internal)
        assert entry is not None
        return entry[1]

    # ---- liveness ------------------------------------------------------------------------------

    def _beat(self, now: float, next_beat: float, interval: float) -> float:
        """The heartbeat's round: Stats out, silent peers reaped, traces and a stale update ended; when
        the next is due."""
        if now - next_beat > interval:  # this loop looked away: not the peers' silence
            self._peers.excuse(now - next_beat, now)
        self._heartbeat(now)
        self._reap_silent(now)
        if self._traces:
            self._end_untracked_traces()
        self._expire_update(now)
        return now + interval

    def _heartbeat(self, now: float) -> None:
        load = self.backend.load()
        self._stats_seq += 1
        tokens = self._iteration_tokens
        waiting = self._waiting(load)
        stats = Stats(
            self.rank, self._stats_seq, time.time(), load.running, waiting, load.kv_usage,
            self.backend.info.num_kv_blocks, load.prefix_cache_queries, load.prefix_cache_hits,
            self._drain_deadline is not None, self.epoch, load.num_preemptions, list(tokens.counts), tokens.total,
        )
        frames = encode(stats)
        sends = [(peer.identity, frames) for peer in self._peers]
        if self._riders is not None:  # they go with the step's outputs (_deliver)
            self._riders += sends
        else:
            self.bridge.send(sends)
        # Every peer gets each Stats direct (its liveness); PUB subscribers (frontends' KV indexes,
        # gateways) get them when the load changed, and at least every PUB_STATS_IDLE_S, so an idle
        # rank does not wake each subscriber ten times a second to say nothing new.
        state = (load.running, waiting, load.kv_usage, load.prefix_cache_queries, load.prefix_cache_hits,
                 stats.draining, load.num_preemptions, tokens.total)
        if state != self._published or now - self._published_at >= PUB_STATS_IDLE_S:
            self._published, self._published_at = state, now
            self.bridge.publish([encode(stats)])

    def _reap_silent(self, now: float) -> None:
        for peer in self._peers.silent_since(now - self.config.client_timeout_s):
            self._abandoned_update(peer)
            orphans = self._peers.leave(peer)
            self.bridge.peers = tuple(p.identity for p in self._peers)
            # A peer that went away with nothing in flight (a readiness probe's session, say) is routine.
            log.log(logging.WARNING if orphans else logging.INFO, "rank %d: frontend %s silent for %.1fs; "
                    "aborting its %d request(s)", self.rank, peer.frontend_id, now - peer.last_seen, len(orphans))
            if orphans:
                self._abort_owned(orphans)
                self._log_aborted(peer, orphans, f"its frontend was silent for {now - peer.last_seen:.1f}s")
            # If it is only slow, not gone, this tells it to handshake again.
            self._send(peer.identity, Reject(RejectCode.EXPIRED.value, (
                f"no message for {now - peer.last_seen:.1f}s (deadline {self.config.client_timeout_s}s): "
                f"{len(orphans)} request(s) aborted; send Hello to start a new session")))

    def _waiting(self, load: Load) -> int:
        """The backend's waiting requests and those held while paused (vLLM's paused scheduler counts them)."""
        return load.waiting + len(self._held)

    def _stats_dict(self) -> dict[str, Any]:
        load = self.backend.load()
        info = self.backend.info
        return {
            "rank": self.rank, "backend": info.name, "model": info.model, "epoch": self.epoch,
            "running": load.running, "waiting": self._waiting(load), "kv_usage": load.kv_usage,
            "prefix_cache_queries": load.prefix_cache_queries,
            "prefix_cache_hits": load.prefix_cache_hits, "num_preemptions": load.num_preemptions,
            "peers": len(self._peers),
            "in_flight": self._peers.in_flight(), "paused": self._is_paused(), "steps": self._step,
            "weight_update_open": self._updater is not None,
        }

    # ---- output --------------------------------------------------------------------------------

    def _deliver(self, outputs: list[RequestOutput], segments: dict[str, list[Segment]] | None = None,
                 pooled: dict[str, Pooled] | None = None) -> None:
        """The one pass over a step's outputs: map ids back, release finished, group per peer. Packed
        logprob segments and pooled arrays go into one raw frame per peer (protocol/logprobs.py,
        protocol/pooled.py), their refs pointed at it; both are 4-byte values, so every offset stays aligned."""
        self._step += 1
        per_peer: dict[bytes, list[RequestOutput]] = {}
        raw: dict[bytes, list[Buffer]] = {}  # per peer: the buffers of its raw frame
        sizes: dict[bytes, int] = {}
        owner, release = self._peers.owner, self._peers.release
        traces = self._traces
        for out in outputs:
            internal = out.request_id
            entry = release(internal) if out.finish_reason is not None else owner(internal)
            if entry is None:
                continue  # aborted or orphaned while the step ran
            if traces:
                trace = traces.get(internal)
                if trace is not None and trace.output(out):
                    del traces[internal]
            peer, out.request_id = entry
            batch = per_peer.get(peer.identity)
            if batch is None:
                per_peer[peer.identity] = [out]
            else:
                batch.append(out)
            if segments and internal in segments:
                buffers = raw.setdefault(peer.identity, [])
                size = sizes.get(peer.identity, 0)
                for ref, parts in segments[internal]:
                    ref.frame, ref.offset = 0, size
                    buffers.extend(parts)
                    size += segment_size(ref.positions, ref.k)
                sizes[peer.identity] = size
            if pooled and internal in pooled:
                pooled_ref, data = pooled[internal]
                size = sizes.get(peer.identity, 0)
                pooled_ref.frame, pooled_ref.offset = 0, size
                raw.setdefault(peer.identity, []).append(data)
                sizes[peer.identity] = size + memoryview(data).nbytes
        riders, self._riders = self._riders, None
        if per_peer or riders:
            now = time.time()
            self.bridge.send([
                *((identity, encode(Outputs(self.rank, self._step, batch, now),
                                    *([b"".join(raw[identity])] if identity in raw else [])))
                  for identity, batch in per_peer.items()),
                *(riders or ()),
            ])

    def _send_outputs(self, peer: Peer, outs: list[RequestOutput]) -> None:
        self._send(peer.identity, Outputs(self.rank, self._step, outs, time.time()))

    def _fail(self, internal_ids: list[str], reason: str, kind: str = ERROR_ENGINE) -> None:
        for internal in internal_ids:
            entry = self._peers.release(internal)
            if entry is not None:
                self._send_outputs(entry[0], [RequestOutput(entry[1], [], "error", error=reason, error_kind=kind)])
                if self._traces:
                    self._end_trace(internal, "error", reason)

    def _log_aborted(self, peer: Peer, internal_ids: list[str], why: str) -> None:
        """One line per aborted request: aborts are rare next to tokens, and each is worth finding."""
        for internal in internal_ids:
            log.info("rank %d aborted request %s of frontend %s: %s", self.rank, internal.split(":", 1)[1],
                     peer.frontend_id, why)

    def _send(self, identity: bytes, msg: Message) -> None:
        self.bridge.send([(identity, encode(msg))])

    def _broadcast(self, msg: Message) -> None:
        frames = encode(msg)
        self.bridge.send([(peer.identity, frames) for peer in self._peers])

    def _publish_kv(self, events: list[KVEvent]) -> None:
        block_size = self.backend.info.block_size
        out = []
        for ev in events:
            self._kv_seq += 1
            if isinstance(ev, Stored):
                msg: Message = BlockStored(self.rank, self._kv_seq, ev.block_hashes,
                                           ev.parent_block_hash, block_size, ev.token_ids, ev.lora)
            elif isinstance(ev, Removed):
                msg = BlockRemoved(self.rank, self._kv_seq, ev.block_hashes)
            else:
                assert isinstance(ev, Cleared)
                msg = AllCleared(self.rank, self._kv_seq)
            out.append(encode(msg))
        self.bridge.publish(out)
