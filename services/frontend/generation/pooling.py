"""Runs a PoolingJob (requests/pooling_job.py) at the engines: each input one engine request, all placed in
one pass on the ranks whose Ready lists the job's task, their pooled outputs gathered in input order. Any
input's failure fails the whole job (the others are aborted); so does the client leaving. The only code
that reads pooled outputs. Runs on each API server's event loop.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

from protocol import ERROR_DRAINING, ERROR_INVALID, GenerateRequest, ProtocolError, RequestOutput, SamplingParams
from protocol.block_hash import block_hashes
from protocol.pooled import unpack
from services.frontend.engine_client.engines import Engine, EngineSet
from services.frontend.engine_client.inflight import CLIENT_GONE, LOST, NOT_SENT, EngineFailure, InFlight, Wakeup
from services.frontend.engine_client.placement import NoEngine, Placement
from services.frontend.errors import APIError
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.shutdown import Shutdown
from services.frontend.requests.pooling_job import Pooled, PoolingJob
from services.frontend.requests.translator import PIN_HEADER

# A pooling request generates nothing; the engine ignores sampling, but the message carries one.
ONE_TOKEN = SamplingParams(max_tokens=1)
# Refusals that prove the rank never ran the input, or a rank lost before it answered: another may run it.
_ELSEWHERE = (ERROR_DRAINING, NOT_SENT, LOST)


@dataclass(slots=True)
class PoolingRun:
    """One job's engine requests in flight: `streams[i]` runs `requests[i]`."""

    job: PoolingJob
    requests: list[GenerateRequest]
    streams: list[InFlight]
    wakeup: Wakeup
    candidates: list[Engine]
    started: float = field(default_factory=time.monotonic)


class PoolingRunner:
    """One per API server process, beside the generation core's launch (frontend_core.py)."""

    def __init__(self, engines: EngineSet, placement: Placement, metrics: Metrics, shutdown: Shutdown,
                 num_labels: int) -> None:
        self._engines, self._placement, self._metrics, self._shutdown = engines, placement, metrics, shutdown
        self._num_labels = num_labels  # the width of a classify output (config.json's labels)

    @contextlib.contextmanager
    def launch(self, job: PoolingJob, pinned: int | None = None) -> Iterator[PoolingRun]:
        """Place and submit every input of `job` in one pass; inside, the run; on leaving, every input still
        at its engine is aborted. Raises APIError when no engine serving the task can take them."""
        if self._shutdown.cut is not None:
            raise APIError(503, self._shutdown.cut)
        candidates = ([self._pinned(job.task, pinned)] if pinned is not None else
                      [e for e in self._engines.engines if job.task in e.tasks])
        if not candidates:
            raise APIError(503, f"no engine rank serving the task {job.task!r} is ready: "
                                f"{self._engines.not_ready() or 'none serves it'}")
        # Engine request ids must be unique among everything in flight at the engines, also when two clients
        # send one X-Request-Id: the response id (for the logs) and a random part.
        base = f"{job.extra.get('request_id') or 'pool'}-{os.urandom(6).hex()}"
        salt = job.extra.get("cache_salt")
        run = PoolingRun(job, [], [], Wakeup(), candidates)
        m = self._metrics
        try:
            for i, item in enumerate(job.inputs):
                request = GenerateRequest(f"{base}-{i}", item.token_ids, ONE_TOKEN, time.time(), job.priority,
                                          job.lora, salt, pinned, item.params)
                stream = InFlight(request.request_id, len(item.token_ids), 1)
                stream.keeps_frames = True  # the pooled values are in the Outputs message's raw frames
                stream.group = run.wakeup
                engine = self._choose(candidates, request)
                self._engines.submit(engine, stream, request)
                run.requests.append(request)
                run.streams.append(stream)
                m.running.inc()
                m.prompt_tokens.inc(stream.prompt_len)
            with self._shutdown.running(*run.streams):
                yield run
        finally:
            for stream in run.streams:
                self._engines.abort(stream)  # a no-op unless it is still running at its engine
                m.running.dec()

    def _pinned(self, task: str, rank: int) -> Engine:
        """The rank X-Data-Parallel-Rank names, looked up among all (placement says why it cannot take the
        inputs: not connected, draining); 400 when there is no such rank or it serves other tasks."""
        engine = next((e for e in self._engines.engines if e.rank == rank), None)
        if engine is None:
            raise APIError(400, f"{PIN_HEADER} {rank} is not a rank of this deployment "
                                f"(ranks: {sorted(e.rank for e in self._engines.engines)})", param=PIN_HEADER)
        if engine.ready is not None and task not in engine.tasks:
            raise APIError(400, f"engine rank {rank} (pinned by {PIN_HEADER}) does not serve the task {task!r} "
                                f"(it serves {list(engine.tasks)})", param=PIN_HEADER)
        return engine

    def _choose(self, engines: list[Engine], request: GenerateRequest, exclude: Collection[int] = ()) -> Engine:
        ids, salt = request.prompt_token_ids, request.cache_salt
        try:
            engine = self._placement.pick(
                [e for e in engines if e.index not in exclude], len(ids),
                lambda size: block_hashes(ids, size, salt=salt, lora=request.lora),
                pinned=request.pinned_rank, request_id=request.request_id)
        except NoEngine as exc:
            raise APIError(exc.status, str(exc), param=PIN_HEADER if exc.status == 400 else None) from None
        return engine

    async def gather(self, run: PoolingRun) -> tuple[list[Pooled], int]:
        """Every input's pooled output, in input order, and the prompt tokens of all. Raises EngineFailure
        (the first input that failed, or the client that left)."""
        streams = run.streams
        results: list[Pooled | None] = [None] * len(streams)
        tried: list[set[int]] = [set() for _ in streams]
        pending = list(range(len(streams)))
        try:
            while pending:
                left = []
                for i in pending:
                    stream = streams[i]
                    if not stream.ready:
                        left.append(i)
                        continue
                    outs = await stream.next()  # ready: returns at once, or raises the stream's failure
                    value = self._take(run, i, outs, stream.raw_frames, tried[i])
                    if value is None:
                        left.append(i)
                    else:
                        results[i] = value
                pending = left
                if pending and not any(streams[i].ready for i in pending):
                    await run.wakeup.wait()
        except EngineFailure as exc:
            gone = any(s.gone == CLIENT_GONE for s in streams)
            self._metrics.finished("abort" if gone else "error")
            raise exc from None
        self._finished(run)
        return results, sum(s.prompt_len for s in streams)  # type: ignore[return-value]  # all set

    def _take(self, run: PoolingRun, i: int, outs: list[RequestOutput], frames: list[Sequence[bytes]],
              tried: set[int]) -> Pooled | None:
        """Input i's pooled values from its outputs, or None while it has none (placed again after a
        refusal that proves it never ran)."""
        stream = run.streams[i]
        for out, raw in zip(outs, frames, strict=True):
            if out.finish_reason == "error" and out.error_kind in _ELSEWHERE and self._place_again(run, i, tried):
                return None
            if out.finish_reason in ("error", "abort"):
                status = 400 if out.error_kind == ERROR_INVALID else 503
                why = out.error or f"the engine ended the request ({out.finish_reason})"
                param = run.job.param_of(i, why)
                raise EngineFailure(f"{param}: {why}", status, param if status == 400 else None)
            if out.finish_reason is None:
                continue
            if out.pooled is None:
                raise EngineFailure(f"engine rank {stream.rank} finished pooling input {i} without a pooled output")
            try:
                flat = unpack(raw, out.pooled)
            except ProtocolError as exc:
                raise EngineFailure(f"engine rank {stream.rank} sent unreadable pooled values: {exc}") from None
            wrong = shape_error(run.job.task, list(out.pooled.shape), stream.prompt_len, self._num_labels)
            if wrong:
                raise EngineFailure(f"engine rank {stream.rank} sent pooled values for input {i} of shape "
                                    f"{list(out.pooled.shape)}: {wrong}")
            values: list[float] = flat.tolist()  # type: ignore[assignment]  # float32: floats; one C loop from the frame's float32 to Python floats
            if not math.isfinite(sum(values)):
                raise EngineFailure(f"engine rank {stream.rank} produced non-finite values for input {i}", 500)
            if len(out.pooled.shape) == 2:
                width = out.pooled.shape[1]
                return [values[r * width:(r + 1) * width] for r in range(out.pooled.shape[0])]
            return values
        return None

    def _place_again(self, run: PoolingRun, i: int, tried: set[int]) -> bool:
        stream, request = run.streams[i], run.requests[i]
        if request.pinned_rank is not None or stream.gone is not None:
            return False
        tried.add(stream.engine_index)
        try:
            engine = self._choose(run.candidates, request, tried)
        except APIError:
            return False
        stream.finished = stream.started = False
        self._engines.submit(engine, stream, request)
        return True

    def _finished(self, run: PoolingRun) -> None:
        """vLLM's request metrics for each input: a finished request with its prompt and no generation."""
        m, took = self._metrics, time.monotonic() - run.started
        for stream in run.streams:
            m.request_done(stream.prompt_len, 0, 1)
            m.e2e.observe(took)
            m.finished("stop")


def shape_error(task: str, shape: list[int], prompt_len: int, num_labels: int) -> str | None:
    """Why a pooled output of `shape` cannot be `task`'s for a prompt of `prompt_len` tokens, or None.
    Checked before the response writers read the values, which trust the shape (as vLLM's own outputs)."""
    if task.startswith("token_"):
        if len(shape) != 2 or shape[0] != prompt_len:
            return f"{task} gives one row per prompt token ({prompt_len})"
    elif len(shape) != 1:
        return f"{task} gives one vector"
    if task.endswith("classify") and shape[-1] != num_labels:
        return f"{task} gives one value per label ({num_labels})"
    return None
