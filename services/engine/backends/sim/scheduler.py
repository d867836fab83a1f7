"""Continuous batching for the sim engine, as vLLM v1 schedules: running requests first, then
waiting ones by (priority, arrival), under one token budget, with chunked prefill, prefix-cache hits
and recompute preemption. Runs in the engine process, once per step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from protocol import PoolingParams, RequestOutput
from protocol.block_hash import chain
from services.engine.backends.sim.block_pool import BlockPool
from services.engine.backends.sim.config import SimConfig

WAITING, RUNNING, DONE = 0, 1, 2


@dataclass(slots=True, eq=False)
class SimRequest:
    request_id: str
    token_ids: list[int]  # prompt, then generated tokens as they are sampled
    num_prompt: int
    hashes: list[int]  # chained hashes of the full blocks known so far (protocol.block_hash)
    root: int  # chain root: protocol.block_hash.root(cache_salt, lora)
    lora: str | None
    priority: int
    arrival: float
    # Sampling state, read by the backend's sampler.
    rand: Callable[[], float]
    max_len: int  # finish "length" at this many tokens (max_tokens or max_model_len)
    min_len: int  # no EOS or stop token before this many tokens (min_tokens)
    stop_ids: frozenset[int] | None
    eos_rate: float  # 0 when ignore_eos or the model has no EOS
    reply: tuple[int, ...] | None = None  # a scripted reply (--sim-script) replaces sampling
    logprobs: int | None = None  # alternatives per generated token's logprobs (sampling.logprobs)
    prompt_logprobs: int | None = None  # the same for the prompt, sent with the first token
    pooling: PoolingParams | None = None  # a pooling request: pooled once its prompt is computed, no tokens
    read_cache: bool = True  # whether its admission looks up the prefix cache (not for per-token pooling)
    # Scheduling state.
    seq: int = 0  # tie-break after (priority, arrival); unique per add
    state: int = WAITING
    num_computed: int = 0  # tokens whose KV is in this request's blocks
    block_ids: list[int] = field(default_factory=list)
    num_committed: int = 0  # leading blocks that are cache hits or registered by this request
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    # Timings (vLLM's events), on the backend's clock: queued when added, first scheduled (a preempted
    # request keeps its first), first token; and how often it was preempted.
    queued_at: float = 0.0
    scheduled_at: float = -1.0
    first_token_at: float = -1.0
    num_preemptions: int = 0


@dataclass(slots=True)
class StepWork:
    outputs: list[RequestOutput]
    prefill_tokens: int  # tokens computed for prompts (and recomputed after preemption)
    num_decodes: int  # sequences that fed their last sampled token
    num_scheduled: int
    # The outputs that carry timings (RequestTimings), with their requests: each request's first token
    # and its finish. The backend stamps them once it knows when the step ends.
    timed: list[tuple[SimRequest, RequestOutput]] = field(default_factory=list)


class Scheduler:
    def __init__(
        self, config: SimConfig, pool: BlockPool, sample: Callable[[SimRequest], RequestOutput]
    ) -> None:
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.pool = pool
        self._sample = sample
        self.requests: dict[str, SimRequest] = {}
        self.running: list[SimRequest] = []  # in admission order: the tail is preempted first
        self._waiting: list[tuple[int, float, int, SimRequest]] = []  # heap; stale entries skipped
        self.num_waiting = 0
        self._seq = 0
        self.prefix_cache_queries = 0  # tokens looked up, cumulative
        self.prefix_cache_hits = 0  # tokens found, cumulative
        self.num_preemptions = 0  # cumulative

    def add(self, req: SimRequest) -> None:
        self._seq += 1
        req.seq = self._seq
        self.requests[req.request_id] = req
        self._push(req)

    def abort(self, request_ids: list[str]) -> None:
        dropped_running = False
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            if req.state == RUNNING:
                self.pool.free(req.block_ids)
                req.block_ids = []
                dropped_running = True
            else:
                self.num_waiting -= 1  # its heap entry is skipped when it surfaces
            req.state = DONE
        if dropped_running:
            self.running = [r for r in self.running if r.state == RUNNING]
        if len(self._waiting) > 2 * self.num_waiting + 64:
            self._waiting = [e for e in self._waiting if e[3].state == WAITING]
            heapify(self._waiting)

    def step(self, now: float = 0.0) -> StepWork:
        """Schedule, compute and sample one step that starts at `now` (what a request's first scheduling
        is stamped with); finished requests are freed and forgotten."""
        bs, pool, sample = self.block_size, self.pool, self._sample
        budget = self.max_num_batched_tokens
        running = self.running
        outputs: list[RequestOutput] = []
        finished: list[SimRequest] = []
        timed: list[tuple[SimRequest, RequestOutput]] = []
        prefill = decodes = 0
        preempted = False
        # 1. Running requests in admission order: a decode takes 1 token, a prefill a chunk.
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_tokens = len(req.token_ids)
            remaining = num_tokens - req.num_computed
            n = remaining if remaining <= budget else budget
            end = req.num_computed + n
            if end > len(req.block_ids) * bs:
                need = (end + bs - 1) // bs - len(req.block_ids)
                blocks = pool.allocate(need)
                while blocks is None:
                    # Recompute preemption of the most recently admitted request (vLLM FCFS).
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                    blocks = pool.allocate(need)
                if blocks is None:
                    break
                req.block_ids += blocks
            i += 1
            budget -= n
            if remaining == 1 and num_tokens > req.num_prompt:
                decodes += 1
            else:
                prefill += n
            req.num_computed = end
            if end // bs > req.num_committed:
                self._commit(req, end // bs)
            if end == num_tokens:
                out = sample(req)
                outputs.append(out)
                if out.finish_reason is not None:
                    finished.append(req)
                    timed.append((req, out))
                elif num_tokens == req.num_prompt:
                    timed.append((req, out))  # its first token
        num_scheduled = i
        # 2. Waiting requests, unless this step had to preempt (as vLLM: no room to admit).
        if not preempted:
            while self.num_waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = self._head()
                n = self._admit(req, budget, now)
                if n == 0:
                    break  # head of line waits for blocks: no overtaking (vLLM FCFS/priority)
                running.append(req)
                num_scheduled += 1
                budget -= n
                prefill += n
                num_tokens = len(req.token_ids)
                if req.num_computed == num_tokens:
                    out = sample(req)
                    outputs.append(out)
                    if out.finish_reason is not None:
                        finished.append(req)
                        timed.append((req, out))
                    elif num_tokens == req.num_prompt:
                        timed.append((req, out))
        # 3. Forget finished requests; their blocks stay cached until evicted.
        if finished:
            for req in finished:
                pool.free(req.block_ids)
                req.block_ids = []
                req.state = DONE
                del self.requests[req.request_id]
            self.running = [r for r in running if r.state == RUNNING]
        return StepWork(outputs, prefill, decodes, num_scheduled, timed)

    def _push(self, req: SimRequest) -> None:
        heappush(self._waiting, (req.priority, req.arrival, req.seq, req))
        self.num_waiting += 1

    def _head(self) -> SimRequest:
        waiting = self._waiting
        while waiting[0][3].state != WAITING:
            heappop(waiting)  # aborted while waiting
        return waiting[0][3]

    def _admit(self, req: SimRequest, budget: int, now: float) -> int:
        """Move the head of waiting to running with its first chunk; 0 if its blocks do not fit."""
        bs, pool = self.block_size, self.pool
        num_tokens = len(req.token_ids)
        # Keep at least the last token to compute: its logits give the next token (vLLM).
        hit = pool.lookup(req.hashes, (num_tokens - 1) // bs) if req.read_cache else []
        cached = len(hit) * bs
        n = min(num_tokens - cached, budget)
        end = cached + n
        need = (end + bs - 1) // bs - len(hit)
        if need > pool.num_free - pool.num_free_among(hit):
            return 0
        heappop(self._waiting)
        self.num_waiting -= 1
        pool.touch(hit)
        blocks = pool.allocate(need)
        assert blocks is not None
        req.block_ids = hit + blocks
        req.num_committed = len(hit)
        req.state = RUNNING
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += cached
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = cached
        if req.scheduled_at < 0:
            req.scheduled_at = now
        req.num_computed = end
        if end // bs > req.num_committed:
            self._commit(req, end // bs)
        return n

    def _preempt(self, req: SimRequest) -> None:
        """Free everything and recompute later; freed blocks stay cached, so it is often cheap."""
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_computed = 0
        req.num_committed = 0
        req.state = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._push(req)  # its original (priority, arrival) puts it ahead of later arrivals

    def _commit(self, req: SimRequest, full: int) -> None:
        """Register blocks that became full of computed tokens (prompt or generated, as vLLM)."""
        bs, hashes, tokens = self.block_size, req.hashes, req.token_ids
        while len(hashes) < full:
            i = len(hashes)
            hashes.append(chain(hashes[-1] if i else req.root, tokens[i * bs : (i + 1) * bs]))
        self.pool.commit(req.block_ids, hashes, req.num_committed, full, tokens, req.lora)
        req.num_committed = full
