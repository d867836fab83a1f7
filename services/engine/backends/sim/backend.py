"""The `sim` model backend: vLLM's engine-core behaviour (batching, prefix cache, preemption, stop
rules) with deterministic pseudo-random tokens and a timing model instead of a model.
Runs in the engine process.
"""
from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Sequence
from hashlib import blake2b
from typing import Any

from protocol import GenerateRequest, PackedPooled, RequestOutput, RequestTimings, SamplingParams
from protocol.block_hash import block_hashes, root
from protocol.logprobs import Buffer
from protocol.pooled import pack
from services.engine.backend import (
    BackendInfo,
    KVEvent,
    Load,
    Pooled,
    RequestRejected,
    Segment,
    StepResult,
    UtilityUnsupported,
    check_adapter_dir,
)
from services.engine.backends.sim.block_pool import BlockPool
from services.engine.backends.sim.config import SimConfig
from services.engine.backends.sim.fake_logprobs import FakeLogprobs
from services.engine.backends.sim.pooler import SimPooler
from services.engine.backends.sim.scheduler import Scheduler, SimRequest
from services.engine.backends.sim.script import Script
from services.engine.weights import WeightSession, views

SIM_VERSION = "0.1.0"
MAX_TOKEN_ID = 2**31  # exclusive; token ids travel as 32-bit values (protocol.block_hash)
UTILITIES = ("add_lora", "list_loras", "remove_lora", "reset_prefix_cache", "sleep", "wake_up", "is_sleeping",
             "start_weight_update", "update_weights", "finish_weight_update", "weight_version")


class SimBackend:
    def __init__(
        self,
        config: SimConfig,
        *,
        model: str,
        vocab_size: int,
        eos_token_id: int | None,
        version: str = SIM_VERSION,
        script: Script | None = None,
        clock: Callable[[], float] = time.monotonic,
        pooler: SimPooler | None = None,
        tasks: tuple[str, ...] = ("generate",),
    ) -> None:
        """`pooler` and `tasks`: a pooling engine (runner "pooling") computes the pooled outputs of `tasks`
        with it; without a pooler the engine generates."""
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if eos_token_id is not None and not 0 <= eos_token_id < MAX_TOKEN_ID:
            raise ValueError(f"eos_token_id must be None or in [0, 2**31), got {eos_token_id!r}")
        self.config = config
        self.info = BackendInfo(
            name="sim",
            version=version,
            model=model,
            max_model_len=config.max_model_len,
            block_size=config.block_size,
            num_kv_blocks=config.num_kv_blocks,
            vocab_size=vocab_size,
            eos_token_id=eos_token_id,
            runner="pooling" if pooler is not None else "generate",
            tasks=tasks if pooler is not None else ("generate",),
        )
        self._pooler = pooler
        self._pooled: dict[str, Pooled] = {}  # this step's pooled arrays, by request id
        self._vocab = vocab_size
        self._eos = eos_token_id
        self._eos_rate = config.eos_rate if eos_token_id is not None else 0.0
        self._max_model_len = config.max_model_len
        self._seed_key = config.seed.to_bytes(8, "little")
        self._pool = BlockPool(config.num_kv_blocks, config.block_size)
        self._scheduler = Scheduler(config, self._pool, self._sample)
        self._echo = config.echo
        self._script = script
        self._loras: dict[str, str] = {}  # name -> path
        self._asleep = False
        self._weights = WeightSession()  # the sim has no weights: updates are checked and counted
        self._fake_logprobs = FakeLogprobs(vocab_size)
        self._segments: dict[str, list[Segment]] = {}  # this step's packed logprobs, by request id
        self._clock = clock  # the engine's clock: RequestTimings are its differences

    # ---- requests ------------------------------------------------------------------------------

    def add(self, request_id: str, request: GenerateRequest) -> None:
        self._validate(request_id, request)
        if request.pooling is not None:
            self._add_pooling(request_id, request)
            return
        prompt = list(request.prompt_token_ids)
        params = request.sampling
        req = SimRequest(
            request_id=request_id,
            token_ids=prompt,
            num_prompt=len(prompt),
            hashes=block_hashes(
                prompt, self.config.block_size, salt=request.cache_salt, lora=request.lora
            ),
            root=root(request.cache_salt, request.lora),
            lora=request.lora,
            priority=request.priority,
            arrival=request.arrival_time,
            rand=random.Random(self._token_seed(prompt, params.seed, request.lora)).random,
            max_len=min(len(prompt) + params.max_tokens, self._max_model_len),
            min_len=len(prompt) + params.min_tokens,
            stop_ids=frozenset(params.stop_token_ids) if params.stop_token_ids else None,
            eos_rate=0.0 if params.ignore_eos else self._eos_rate,
            # Decoding the prompt costs time: only when a script is loaded.
            reply=self._script.reply_for(prompt) if self._script is not None else None,
            logprobs=params.logprobs,
            prompt_logprobs=params.prompt_logprobs,
            queued_at=self._clock(),
        )
        self._scheduler.add(req)

    def _add_pooling(self, request_id: str, request: GenerateRequest) -> None:
        """A pooling request runs its prompt once, as a prefill; its output is pooled at the end of it."""
        pooling = request.pooling
        assert pooling is not None and self._pooler is not None  # _validate refused it otherwise
        self._pooler.check(pooling)
        prompt = list(request.prompt_token_ids)
        self._scheduler.add(SimRequest(
            request_id=request_id, token_ids=prompt, num_prompt=len(prompt),
            hashes=block_hashes(prompt, self.config.block_size, salt=request.cache_salt, lora=request.lora),
            root=root(request.cache_salt, request.lora), lora=request.lora, priority=request.priority,
            arrival=request.arrival_time, rand=_no_sampling, max_len=len(prompt) + 1, min_len=0, stop_ids=None,
            eos_rate=0.0, queued_at=self._clock(), pooling=pooling,
            # As vLLM: per-token outputs need every position computed, so they never read the prefix cache.
            read_cache=not pooling.task.startswith("token_"),
        ))

    def abort(self, request_ids: list[str]) -> None:
        self._scheduler.abort(request_ids)

    def has_work(self) -> bool:
        # Pending KV events (a reset before sleep) still need a step to reach subscribers.
        return bool(self._pool.events) or (not self._asleep and bool(self._scheduler.requests))

    def step(self) -> StepResult:
        if self._asleep:
            return StepResult(kv_events=self._drain_events())
        start = self._clock()
        work = self._scheduler.step(start)
        duration = 0.0
        if not self.config.instant:
            duration = work.prefill_tokens / self.config.prefill_tps
            if work.num_decodes:
                per_seq = self.config.decode_ms_per_seq * work.num_scheduled
                duration += (self.config.decode_ms + per_seq) / 1000.0
        # The step's tokens exist when its (simulated) time is up: the core loop delivers them then.
        generated = sum(len(o.new_token_ids) for o in work.outputs) if self._pooled else len(work.outputs)
        num_tokens = generated + self._stamp(work.timed, start + duration)
        segments, self._segments = self._segments, {}
        pooled, self._pooled = self._pooled, {}
        return StepResult(work.outputs, self._drain_events(), duration, segments, num_tokens, pooled)

    @staticmethod
    def _stamp(timed: list[tuple[SimRequest, RequestOutput]], end: float) -> int:
        """Timings on each request's first-token and finishing outputs, its tokens made at `end`; returns
        the prompt tokens computed of the requests with their first token (vLLM's iteration tokens)."""
        prompt = 0
        for req, out in timed:
            if req.first_token_at < 0:
                req.first_token_at = end
                prompt += req.num_prompt - req.num_cached_tokens
            out.timings = RequestTimings(req.scheduled_at - req.queued_at, req.first_token_at - req.scheduled_at,
                                         end - req.first_token_at, req.num_preemptions)
        return prompt

    def load(self) -> Load:
        s = self._scheduler
        return Load(
            running=len(s.running),
            waiting=s.num_waiting,
            kv_usage=self._pool.usage(),
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
        )

    def shutdown(self) -> None:
        self._scheduler.abort(list(self._scheduler.requests))

    # ---- utilities -----------------------------------------------------------------------------

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        if name == "reset_prefix_cache":
            return self._pool.reset()
        if name == "add_lora":  # as the vllm backend's: the same adapter again is False, another path an error
            lora = _str_arg(name, args, "name")
            # The sim loads nothing from it, but refuses what the vllm backend refuses: a path that is not
            # an adapter directory (a file, a URL) would otherwise be listed as an adapter's root.
            path = _str_arg(name, args, "path")
            if lora in self._loras:
                if self._loras[lora] == path:
                    return False
                raise ValueError(f"add_lora: an adapter named {lora!r} is already loaded from "
                                 f"{self._loras[lora]!r}; remove_lora it first")
            check_adapter_dir(path)
            self._loras[lora] = path
            return True
        if name == "remove_lora":
            lora = _str_arg(name, args, "name")
            return self._loras.pop(lora, None) is not None
        if name == "list_loras":
            return sorted(self._loras)
        if name == "sleep":
            level = args.get("level", 1)
            if level not in (1, 2) or isinstance(level, bool):
                raise ValueError(f"sleep.level must be 1 or 2, got {level!r}")
            if self._scheduler.running:
                raise ValueError(
                    f"sleep refused: {len(self._scheduler.running)} requests are running; "
                    "abort or finish them first"
                )
            # Sleeping discards the KV cache, as vLLM does; subscribers learn it from Cleared.
            self._pool.reset()
            self._asleep = True
            return None
        if name == "wake_up":
            self._asleep = False
            return None
        if name == "is_sleeping":
            return self._asleep
        if name == "start_weight_update":
            self._weights.start()
            return True
        if name == "update_weights":
            self._weights.require_open(name)
            return self._weights.received(views(args["tensors"], frames))
        if name == "finish_weight_update":
            result = self._weights.finish(args["version"])
            # As the vllm backend: cached prefixes were computed by the old weights (kept while running).
            self._pool.reset()
            return result
        if name == "weight_version":
            return self._weights.version
        raise UtilityUnsupported(f"sim backend has no utility {name!r}; it supports {UTILITIES}")

    # ---- internals -----------------------------------------------------------------------------

    def _validate(self, request_id: str, request: GenerateRequest) -> None:
        if request_id in self._scheduler.requests:
            raise RequestRejected(f"request_id {request_id!r} is already in use")
        prompt = request.prompt_token_ids
        if not prompt:
            raise RequestRejected("prompt_token_ids must not be empty")
        if (request.pooling is None) != (self._pooler is None):
            served = list(self.info.tasks)
            task = "generate" if request.pooling is None else request.pooling.task
            raise RequestRejected(f"task {task!r} is not served by this engine's model: it serves {served}")
        if request.pooling is not None:
            if request.pooling.task not in self.info.tasks:
                raise RequestRejected(f"pooling.task={request.pooling.task!r} is not served by this engine's "
                                      f"model: it serves {list(self.info.tasks)}")
            if len(prompt) > self._max_model_len:
                raise RequestRejected(f"prompt_token_ids has {len(prompt)} tokens; must be <= max_model_len "
                                      f"({self._max_model_len})")
        elif len(prompt) >= self._max_model_len:
            raise RequestRejected(
                f"prompt_token_ids has {len(prompt)} tokens; must be < max_model_len "
                f"({self._max_model_len}) to leave room for one generated token"
            )
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= MAX_TOKEN_ID:
            bad = low if low < 0 else high
            raise RequestRejected(f"prompt_token_ids must be in [0, 2**31), got token id {bad}")
        if request.lora is not None and request.lora not in self._loras:
            raise RequestRejected(
                f"lora {request.lora!r} is not loaded; loaded: {sorted(self._loras)}"
            )
        if request.pooling is not None:
            return  # its sampling is ignored
        unhonoured = _unhonoured(request.sampling)
        if unhonoured is not None:
            # Refused, never ignored: a client relying on a schema or a bias must not get free text.
            raise RequestRejected(f"sampling.{unhonoured}: the sim backend cannot honour it (its tokens "
                                  "ignore structured-output constraints and logits controls)")
        params = request.sampling
        if params.max_tokens < 1:
            raise RequestRejected(f"sampling.max_tokens must be >= 1, got {params.max_tokens}")
        if not 0 <= params.min_tokens <= params.max_tokens:
            raise RequestRejected(
                f"sampling.min_tokens must be in [0, max_tokens={params.max_tokens}], "
                f"got {params.min_tokens}"
            )

    def _token_seed(self, prompt: list[int], seed: int | None, lora: str | None = None) -> int:
        """The request's token stream seed; a LoRA adapter's name is mixed in, so that its tokens differ
        from the base model's (what a test can see)."""
        if seed is not None and lora is None:
            return seed
        # blake2b, not hash(): stable across processes and runs (PYTHONHASHSEED does not matter).
        data = str(seed).encode() if seed is not None else array("I", prompt).tobytes()
        h = blake2b(data, digest_size=8, key=self._seed_key, person=b"fleet-sim")
        if lora is not None:
            h.update(b"\0lora\0" + lora.encode())
        return int.from_bytes(h.digest(), "little")

    def _sample(self, req: SimRequest) -> RequestOutput:
        """The next token of a request whose tokens are all computed, and vLLM's stop checks; a pooling
        request's pooled output instead (no token: it finishes with "stop")."""
        if req.pooling is not None:
            return self._pooled_output(req)
        if req.reply is not None:
            return self._scripted(req, req.reply)
        tokens = req.token_ids
        num_tokens = len(tokens)
        # As vLLM's min_tokens logits processor: EOS and stop tokens are masked until then.
        may_stop = num_tokens >= req.min_len
        rand = req.rand
        finish: str | None = None
        stop_reason: int | None = None
        if may_stop and req.eos_rate and rand() < req.eos_rate:
            assert self._eos is not None  # eos_rate is 0 without an EOS token (__init__)
            token = self._eos
            finish = "stop"
        else:
            stops = req.stop_ids
            if self._echo:  # replay the prompt: scripted output for detokenization tests
                token = tokens[(num_tokens - req.num_prompt) % req.num_prompt]
            else:
                token = int(rand() * self._vocab)
                if token == self._eos or (stops is not None and not may_stop and token in stops):
                    token = self._substitute(token, None if may_stop else stops)
            if stops is not None and may_stop and token in stops:
                finish = "stop"
                stop_reason = token
        tokens.append(token)
        if finish is None and num_tokens + 1 >= req.max_len:
            finish = "length"
        return self._with_logprobs(req, RequestOutput(req.request_id, [token], finish, stop_reason,
                                                      req.num_cached_tokens))

    def _pooled_output(self, req: SimRequest) -> RequestOutput:
        assert req.pooling is not None and self._pooler is not None
        values, shape = self._pooler.pool(req.pooling, req.token_ids)
        ref = PackedPooled(0, 0, shape)
        self._pooled[req.request_id] = (ref, pack(values))
        return RequestOutput(req.request_id, [], "stop", None, req.num_cached_tokens, pooled=ref)

    def _scripted(self, req: SimRequest, reply: tuple[int, ...]) -> RequestOutput:
        """The reply's next token; after the last one EOS, as if sampled ("stop", stop_reason None).

        A scripted reply ignores stop_token_ids, min_tokens, ignore_eos and --sim-eos-rate; only
        max_tokens (or max_model_len) cuts it short. Indexed by tokens generated, so a preempted
        request resumes where it was.
        """
        tokens = req.token_ids
        i = len(tokens) - req.num_prompt
        finish: str | None = None
        if i < len(reply):
            token = reply[i]
            if i + 1 == len(reply) and self._eos is None:  # no EOS to end with: the reply ends it
                finish = "stop"
        else:
            assert self._eos is not None  # without EOS the last reply token finished the request
            token = self._eos
            finish = "stop"
        tokens.append(token)
        if finish is None and len(tokens) >= req.max_len:
            finish = "length"
        return self._with_logprobs(req, RequestOutput(req.request_id, [token], finish, None, req.num_cached_tokens))

    def _with_logprobs(self, req: SimRequest, out: RequestOutput) -> RequestOutput:
        """The fake distribution's logprobs (sim/fake_logprobs.py) of the token just sampled, and with the
        first one those of the prompt, when the request asked for them."""
        if req.logprobs is None and req.prompt_logprobs is None:
            return out
        segments = self._segments[out.request_id] = []
        if req.prompt_logprobs is not None and len(req.token_ids) == req.num_prompt + 1 and req.num_prompt > 1:
            segment = self._fake_logprobs.segment(req.token_ids[1:req.num_prompt], req.prompt_logprobs)
            out.packed_prompt_logprobs = segment[0]
            segments.append(segment)
        if req.logprobs is not None:
            segment = self._fake_logprobs.segment(out.new_token_ids, req.logprobs)
            out.packed_logprobs = segment[0]
            segments.append(segment)
        return out

    def _substitute(self, token: int, masked: frozenset[int] | None) -> int:
        """The next regular token that is neither EOS (only eos_rate emits it) nor masked."""
        vocab, eos = self._vocab, self._eos
        for _ in range(len(masked or ()) + 2):
            token = (token + 1) % vocab
            if token != eos and (masked is None or token not in masked):
                return token
        return token  # every regular token is forbidden: a degenerate vocab, emit anyway

    def _drain_events(self) -> list[KVEvent]:
        events = self._pool.events
        if not events:
            return []
        self._pool.events = []
        return events


def _no_sampling() -> float:
    raise AssertionError("a pooling request samples nothing")


def _unhonoured(s: SamplingParams) -> str | None:
    """The first field set that changes which tokens are sampled in ways the sim does not model."""
    for name in ("json_schema", "regex", "choice", "grammar", "structural_tag", "logit_bias", "allowed_token_ids"):
        if getattr(s, name) is not None:
            return name
    if s.json_object:
        return "json_object"
    return "bad_words" if s.bad_words else None


def _str_arg(utility: str, args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{utility}.{key} must be a non-empty string, got {value!r}")
    return value
