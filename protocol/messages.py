"""Every struct on the wire. Field order is the wire format: append only, always with a default.

`schema.lock.json` pins names, types and order; `python -m protocol.schema --check` says what an edit
broke. Hello and Reject are frozen across majors so a peer of any version can be refused readably.
"""
from __future__ import annotations

from typing import Any, ClassVar, Union, get_args

import msgspec


class _Wire(msgspec.Struct, array_like=True, frozen=True):
    """Base: positional msgpack array; missing trailing fields get defaults, extra ones are ignored.

    Subclasses repeat `frozen=True`: msgspec inherits it, but type checkers (dataclass_transform)
    read only a class's own keywords."""

    TAG: ClassVar[int] = 0


class _Item(msgspec.Struct, array_like=True, gc=False):
    """Base for nested values that are built in hot loops (no GC tracking, mutable while built)."""


# ---- handshake ---------------------------------------------------------------------------------


class Hello(_Wire, frozen=True):
    """frontend -> engine, first message on a connection. Frozen prefix across majors."""

    TAG: ClassVar[int] = 1
    major: int
    minor: int
    schema_fingerprint: str
    frontend_id: str
    auth_token: str | None = None


class Ready(_Wire, frozen=True):
    """engine -> frontend: handshake accepted; what the frontend needs to place and validate work."""

    TAG: ClassVar[int] = 2
    rank: int
    model: str
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    backend: str
    engine_version: str
    session_epoch: str
    pub_port: int = 0
    major: int = 0
    minor: int = 0
    # Since MINOR 5: what the engine's model does, as vLLM names it: runner "generate" or "pooling",
    # and the tasks it serves ("generate"; or pooling tasks: "embed", "classify", "token_embed",
    # "token_classify"). Older engines send neither: they generate.
    runner: str = "generate"
    tasks: list[str] = []


class Reject(_Wire, frozen=True):
    """engine -> frontend: handshake refused. Frozen across majors."""

    TAG: ClassVar[int] = 3
    code: str
    reason: str


class Heartbeat(_Wire, frozen=True):
    """frontend -> engine liveness ping; any message from a peer also counts as a sign of life."""

    TAG: ClassVar[int] = 4
    seq: int
    sent_at: float


# ---- requests ----------------------------------------------------------------------------------


class SamplingParams(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """_Item's settings, frozen: a type checker refuses a frozen subclass of a mutable base."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Since MINOR 2: the output must match this JSON Schema (JSON text), guaranteed by the engine's
    # structured-output support, or the request is refused. An older engine would ignore it: the
    # frontend sends it only to engines whose Ready says MINOR >= 2.
    json_schema: str | None = None
    # Since MINOR 3: logprobs of the prompt's tokens, with this many alternatives each (vLLM's
    # prompt_logprobs), as packed arrays (RequestOutput.packed_prompt_logprobs). An older engine would
    # ignore it: the frontend asks for logprobs only from engines whose Ready says MINOR >= 3.
    prompt_logprobs: int | None = None
    # Since MINOR 3: the other structured-output constraints, named as vLLM's StructuredOutputsParams
    # names them (at most one of them and json_schema is set: the output fully matches a regex, is one
    # of the choices, follows a grammar (EBNF or Lark, as xgrammar reads them), is any JSON object, or
    # follows a structural tag (JSON text)), and the logits controls: a bias added to the logits of
    # token ids (in [-100, 100]), the only token ids that may be sampled, and words that may not be
    # generated (tokenized by the engine, as vLLM does). An engine that cannot honour one (the sim)
    # refuses the request; an older one would drop them unread, so the frontend sends them only to
    # engines whose Ready says MINOR >= 3.
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = []


class PoolingParams(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A pooling request's parameters (since MINOR 5), named as vLLM's PoolingParams names them.

    task: "embed", "classify", "token_embed" or "token_classify" (one the engine's Ready lists); a
    cross-encoder score is "classify" over a (query, document) pair. dimensions: a matryoshka
    truncation of the embedding (embed, token_embed). use_activation: None is the model's default
    (normalize embeddings, softmax/sigmoid class logits), False returns the raw pooled values.
    token_type_split: for a pair, the index of the first token of the second text (token type 1 from
    there on: vLLM's compressed_token_type_ids); None for a single text."""

    task: str
    dimensions: int | None = None
    use_activation: bool | None = None
    token_type_split: int | None = None


class GenerateRequest(_Wire, frozen=True):
    """A request for one engine. With `pooling` set (since MINOR 5) it is a pooling request: the engine
    runs the prompt once and answers with one RequestOutput carrying `pooled` (no tokens), and
    `sampling` is ignored (the frontend sends max_tokens=1). An older engine would generate instead,
    so the frontend sends pooling requests only to engines whose Ready lists the task."""

    TAG: ClassVar[int] = 5
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float
    priority: int = 0
    lora: str | None = None
    cache_salt: str | None = None
    pinned_rank: int | None = None
    pooling: PoolingParams | None = None
    # Since MINOR 6: the request's W3C trace context (`traceparent`, optionally `tracestate`), as vLLM's
    # EngineCoreRequest.trace_headers: the engine's span for it continues the frontend's. None: not traced.
    # An older engine ignores it (extra trailing fields are dropped): its requests are only not traced.
    trace_headers: dict[str, str] | None = None


class Abort(_Wire, frozen=True):
    TAG: ClassVar[int] = 6
    request_ids: list[str]


class UtilityCall(_Wire, frozen=True):
    """An allowlisted engine operation by name; unknown names get an error result."""

    TAG: ClassVar[int] = 7
    call_id: int
    name: str
    args: dict[str, Any] = {}


class UtilityResult(_Wire, frozen=True):
    TAG: ClassVar[int] = 8
    call_id: int
    ok: bool
    result: Any = None
    error: str | None = None


# ---- outputs -----------------------------------------------------------------------------------


class Logprobs(_Item):
    """Per new token: the sampled token's logprob and rank, and the top-k alternatives, as lists.

    Written by MINOR 0-2 engines; from MINOR 3 on engines write packed arrays instead
    (RequestOutput.packed_logprobs) and leave this None. Kept for the wire format (append only)."""

    sampled: list[float]
    ranks: list[int]
    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]


class PackedLogprobs(_Item):
    """Where one output's logprobs lie in its Outputs message's raw frames (since MINOR 3): a segment of
    packed arrays for `positions` token positions with `k` alternatives each, at byte `offset` of raw
    frame `frame` (0 is the first frame after the body). protocol/logprobs.py has the layout."""

    frame: int
    offset: int
    positions: int
    k: int


class PackedPooled(_Item):
    """Where one pooling request's output lies in its Outputs message's raw frames (since MINOR 5): a
    little-endian float32 array of `shape` (one dimension: a sequence's embedding or class scores; two:
    one row per token) at byte `offset` of raw frame `frame`. protocol/pooled.py reads and writes it."""

    frame: int
    offset: int
    shape: list[int]


class RequestTimings(_Item):
    """A request's phases in seconds on its engine's clock (since MINOR 4), as vLLM defines them: queued =
    first scheduled - queued (its arrival at the engine core), prefill = first token - first scheduled,
    decode = latest token - first token (so inference = prefill + decode). A preempted request keeps its
    first scheduling: the time it spent preempted counts in prefill or decode, as in vLLM.
    num_preemptions: how often it was preempted so far."""

    queued_time: float
    prefill_time: float
    decode_time: float
    num_preemptions: int


class RequestOutput(_Item):
    """One request's new tokens from one engine step. finish_reason: stop, length, abort or error.

    With finish_reason "error", error_kind says whose the fault is (since MINOR 1): ERROR_INVALID (the
    request itself: it fails anywhere), ERROR_DRAINING (this rank takes no new work: send it to
    another), ERROR_ENGINE (the engine failed it); None from older engines means ERROR_ENGINE.

    Since MINOR 3, logprobs travel as packed arrays in raw frames: `packed_logprobs` one row per new
    token (when sampling.logprobs was set), `packed_prompt_logprobs` one row per prompt position from
    the second on (when sampling.prompt_logprobs was set; a chunked prefill sends them in several
    outputs, in order, before or with the first token).

    Since MINOR 4, `timings` comes twice per request: with its first token (decode_time 0) and with the
    engine's finish (stop or length), so that a request the frontend ends itself (a stop string) still
    has the engine's queue and prefill times. Never per token. None from older engines."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: Union[int, str, None] = None
    num_cached_tokens: int = 0
    logprobs: Logprobs | None = None
    error: str | None = None
    error_kind: str | None = None
    packed_logprobs: PackedLogprobs | None = None
    packed_prompt_logprobs: PackedLogprobs | None = None
    timings: RequestTimings | None = None
    # Since MINOR 5: a pooling request's result, with finish_reason "stop" and no new tokens.
    pooled: PackedPooled | None = None


ERROR_INVALID, ERROR_DRAINING, ERROR_ENGINE = "invalid", "draining", "engine"


class Outputs(_Wire, frozen=True):
    """Everything one engine step produced for one frontend."""

    TAG: ClassVar[int] = 9
    rank: int
    step: int
    outputs: list[RequestOutput]
    timestamp: float = 0.0


# vLLM's buckets of vllm:iteration_tokens_total (tokens per engine step): Stats.iteration_tokens counts
# steps per bucket, so both sides must agree on them; changing them is a new field, not an edit.
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Stats(_Wire, frozen=True):
    """engine heartbeat and load report, about every 100 ms, also when idle. seq orders snapshots.

    Since MINOR 4, cumulative since the engine started (its session_epoch): num_preemptions, and the
    steps that produced outputs by their tokens as vLLM counts them (prompt tokens computed, counted
    with the request's first token, plus tokens generated): iteration_tokens[i] is the number of steps
    with at most ITERATION_TOKENS_BUCKETS[i] tokens and more than the bucket before it, the last entry
    those above every bucket (len(ITERATION_TOKENS_BUCKETS) + 1 entries; empty from older engines), and
    iteration_tokens_sum their tokens."""

    TAG: ClassVar[int] = 10
    rank: int
    seq: int
    timestamp: float
    running: int
    waiting: int
    kv_usage: float
    num_kv_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    draining: bool = False
    session_epoch: str = ""
    num_preemptions: int = 0
    iteration_tokens: list[int] = []
    iteration_tokens_sum: int = 0


class EngineDead(_Wire, frozen=True):
    TAG: ClassVar[int] = 11
    rank: int
    reason: str


# ---- KV-cache events (PUB socket) -------------------------------------------------------------


class BlockStored(_Wire, frozen=True):
    """Full blocks now cached. Hashes are protocol.block_hash chain values, computable by anyone."""

    TAG: ClassVar[int] = 12
    rank: int
    seq: int
    block_hashes: list[int]
    parent_block_hash: int | None
    block_size: int
    token_ids: list[int] = []
    lora: str | None = None


class BlockRemoved(_Wire, frozen=True):
    TAG: ClassVar[int] = 13
    rank: int
    seq: int
    block_hashes: list[int]


class AllCleared(_Wire, frozen=True):
    TAG: ClassVar[int] = 14
    rank: int
    seq: int


Message = Union[  # every message on the wire, in tag order
    Hello,
    Ready,
    Reject,
    Heartbeat,
    GenerateRequest,
    Abort,
    UtilityCall,
    UtilityResult,
    Outputs,
    Stats,
    EngineDead,
    BlockStored,
    BlockRemoved,
    AllCleared,
]

# The one list of messages: the union above; their tags come from the classes.
MESSAGE_TYPES: dict[int, type[Message]] = {cls.TAG: cls for cls in get_args(Message)}
assert len(MESSAGE_TYPES) == len(get_args(Message)), "two messages share a tag"

# Nested structs: not messages themselves, but part of the schema lock.
NESTED_TYPES: tuple[type[msgspec.Struct], ...] = (SamplingParams, Logprobs, PackedLogprobs, RequestTimings,
                                                   RequestOutput, PoolingParams, PackedPooled)
