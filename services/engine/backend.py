"""The port between the engine core loop and a model backend (vllm or sim), and what a step returns.

The core loop owns peers and request ownership; a backend only sees engine-internal request ids.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Union

from protocol import GenerateRequest, PackedLogprobs, PackedPooled, RequestOutput
from protocol.logprobs import Buffer


class RequestRejected(ValueError):
    """The backend cannot accept this request; the message goes back to the client as its error."""


class UtilityUnsupported(RuntimeError):
    """This backend does not implement that (allowlisted) utility."""


class ModelBroken(RuntimeError):
    """The model can no longer be trusted (a weight update failed inside the model's loader, or its
    client left it half-loaded): the rank fails (EngineDead to every peer, exit code 1), so its
    supervisor starts it again from the checkpoint, rather than serve from half-loaded weights or
    hold its requests forever."""


def check_adapter_dir(path: str) -> None:
    """What every backend's add_lora accepts as a path: a local PEFT adapter directory (its
    adapter_config.json there). A file, a URL or a hub id is refused, naming the argument."""
    if not Path(path, "adapter_config.json").is_file():
        raise ValueError(f"add_lora.path {path!r}: no adapter_config.json there (a PEFT adapter directory)")


@dataclass(frozen=True, slots=True)
class BackendInfo:
    name: str  # "vllm" or "sim"
    version: str
    model: str
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    vocab_size: int
    eos_token_id: int | None
    # What the model does, as vLLM names it (Ready.runner, Ready.tasks): "generate" with ("generate",), or
    # "pooling" with the pooling tasks it serves ("embed", "classify", "token_embed", "token_classify").
    runner: str = "generate"
    tasks: tuple[str, ...] = ("generate",)
    # False where the model cannot run between start_weight_update and finish_weight_update (vLLM's
    # layerwise reload puts its layers on the meta device): the core loop runs no step meanwhile.
    runs_during_weight_update: bool = True


@dataclass(slots=True)
class Load:
    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV block pool in use
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int = 0  # of which found, cumulative
    num_preemptions: int = 0  # requests preempted (vLLM's PREEMPTED events), cumulative


# KV events as a backend reports them; the core loop stamps rank and sequence numbers.
@dataclass(frozen=True, slots=True)
class Stored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    lora: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


KVEvent = Union[Stored, Removed, Cleared]
# A packed logprobs segment (protocol/logprobs.py): the ref set on its output, and the buffers that make
# up its bytes (token ids, logprobs, ranks), which the core loop places in its peer's raw frame.
Segment = tuple[PackedLogprobs, Sequence[Buffer]]
# A pooled result (protocol/pooled.py): the ref set on its output (shape filled in, frame and offset the core
# loop's to set), and its float32 little-endian bytes, which go in the same raw frame as the segments.
Pooled = tuple[PackedPooled, Buffer]


@dataclass(slots=True)
class StepResult:
    # Per request with news this step; a finished request carries finish_reason ("stop"/"length"/
    # "error") and is forgotten by the backend. Request ids are the engine-internal ones given to add().
    # A request's first output with tokens and its finish carry its timings (RequestTimings).
    outputs: list[RequestOutput] = field(default_factory=list)
    kv_events: list[KVEvent] = field(default_factory=list)
    # Simulated time this step takes (sim backend); the core loop delivers outputs after it. 0 = real.
    duration_s: float = 0.0
    # Logprob segments of outputs that carry PackedLogprobs refs, by the output's request id.
    segments: dict[str, list[Segment]] = field(default_factory=dict)
    # The step's tokens as vLLM's vllm:iteration_tokens_total counts them: prompt tokens computed (not
    # cached), counted in the step of the request's first token, plus tokens generated.
    num_tokens: int = 0
    # Pooled arrays of outputs that carry PackedPooled refs (pooling requests' finishes), by request id.
    pooled: dict[str, Pooled] = field(default_factory=dict)


class Backend(Protocol):
    info: BackendInfo

    def add(self, request_id: str, request: GenerateRequest) -> None:
        """Queue a request under an engine-internal id. Raises RequestRejected for bad input."""

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests now; emits nothing for them (the core loop sends the abort finish)."""

    def has_work(self) -> bool: ...

    def step(self) -> StepResult:
        """Run one engine step (schedule, execute, sample) over the current batch."""

    def load(self) -> Load: ...

    def utility(self, name: str, args: dict[str, Any], frames: Sequence[Buffer] = ()) -> Any:
        """Run an allowlisted utility (the core loop checks the name and args first, defaults filled in);
        `frames` are the UtilityCall's raw frames (update_weights' tensor bytes)."""

    def shutdown(self) -> None: ...
