"""vLLM's EngineCore faked where the vllm backend uses it, so that the backend runs in-process with no
model: requests are kept, each step returns the outputs a test scripted (vLLM's own output structs).
Imports vllm: only for tests/vllm and the benchmarks that run with it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np

import checkpoints
from protocol import GenerateRequest, SamplingParams
from services.engine.config import EngineConfig


class FakeEngineCore:
    """Requests are kept until a scripted output finishes them or they are aborted; a step with
    nothing scripted ends every request (the backend's warm-up)."""

    def __init__(self, vllm_config: Any, executor_class: Any, log_stats: bool) -> None:
        # The tokenizer as vLLM's StructuredOutputManager loads it: requests with a constraint need one.
        from vllm.tokenizers import cached_tokenizer_from_config

        self.requests: dict[str, Any] = {}
        self.script: list[list[Any]] = []
        self.scheduler = SimpleNamespace(kv_event_publisher=None, has_requests=lambda: bool(self.requests),
                                         get_request_counts=lambda: (len(self.requests), 0),
                                         kv_cache_manager=SimpleNamespace(usage=0.0))
        tokenizer = cached_tokenizer_from_config(model_config=vllm_config.model_config)
        self.structured_output_manager = SimpleNamespace(tokenizer=tokenizer)

    def preprocess_add_request(self, request: Any) -> tuple[Any, int]:
        return request, 0

    def add_request(self, request: Any, wave: int) -> None:
        self.requests[request.request_id] = request

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.requests.pop(rid, None)

    def step(self) -> tuple[dict[int, Any], bool]:
        from vllm.v1.engine import EngineCoreOutputs

        if not self.script:
            self.requests.clear()
            return {}, False
        outputs = self.script.pop(0)
        for o in outputs:
            if o.finish_reason is not None:
                self.requests.pop(o.request_id, None)
        return {0: EngineCoreOutputs(outputs=outputs, timestamp=time.monotonic())}, True

    def post_step(self, executed: bool) -> None:
        pass

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def reset_prefix_cache(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass


@contextmanager
def backend_with_fake_core(module: Any = None, **config: Any) -> Iterator[Any]:
    """A VllmBackend on the tiny model's config and tokenizer (no weights) around a FakeEngineCore;
    `module`: the backend's module (default services.engine.backends.vllm, another copy to compare)."""
    if module is None:
        from services.engine.backends import vllm as module
    saved = module.EngineCore
    module.EngineCore = FakeEngineCore
    try:
        config.setdefault("max_model_len", 256)
        yield module.VllmBackend(EngineConfig(model="tiny", backend="vllm", **config), checkpoints.resolve("tiny"))
    finally:
        module.EngineCore = saved


def output(rid: str, tokens: list[int], *, first: bool = False, finish: int | None = None,
           logprobs: int | None = None, prompt_len: int = 4) -> Any:
    """vLLM's output of one request for one step: `first` carries its prefill stats (one prompt token
    cached) and its events (queued, scheduled); `logprobs`: k alternatives per new token."""
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason
    from vllm.v1.metrics.stats import PrefillStats
    from vllm.v1.outputs import LogprobsLists

    now = time.monotonic()
    o = EngineCoreOutput(rid, tokens, finish_reason=None if finish is None else FinishReason(finish))
    if first:
        o.prefill_stats = PrefillStats(prompt_len, prompt_len - 1, 1)
        o.events = [EngineCoreEvent(EngineCoreEventType.QUEUED, now - 0.2),
                    EngineCoreEvent(EngineCoreEventType.SCHEDULED, now - 0.1)]
    if logprobs is not None and tokens:
        w = logprobs + 1
        o.new_logprobs = LogprobsLists(np.zeros((len(tokens), w), np.int32), np.zeros((len(tokens), w), np.float32),
                                       np.zeros(len(tokens), np.int32))
    return o


def request(rid: str, prompt_len: int = 4, **sampling: Any) -> GenerateRequest:
    sampling.setdefault("max_tokens", 8)
    return GenerateRequest(rid, list(range(1, prompt_len + 1)), SamplingParams(**sampling), time.time())
