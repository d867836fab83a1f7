"""POST /inference/v1/generate's body in vLLM's shape (its disagg GenerateRequest: token ids and vLLM's
SamplingParams as JSON), checked and turned into the engine's SamplingParams. Used by translation in
each API server process (in a worker process for long bodies).

Every field of vLLM's SamplingParams is honoured or refused: the ones this route cannot give
(logprobs, ...) are accepted at their defaults only, so vLLM's render output (which omits defaults) and
this frontend's both pass, and a request that relies on one gets a 400 naming it. Structured outputs
and the logits controls are checked as the chat route checks them (structured.py, openai_schema.py).
"""
from __future__ import annotations

from array import array
from typing import Any

import msgspec

from protocol import SamplingParams
from services.frontend.errors import APIError
from services.frontend.requests.openai_schema import BOUNDS, StreamOptions, allowed_token_ids, bad_words, logit_bias
from services.frontend.requests.structured import Constraint, from_structured_outputs
from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS

PREFIX = "sampling_params"


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's StructuredOutputsParams, as vLLM serializes it (so unknown keys pass: its private ones)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class TokenSampling(msgspec.Struct, kw_only=True):
    """vLLM's SamplingParams, by its field names and defaults."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # Absent or null: the rest of the context, as vLLM's generate does when the caller did not set it.
    max_tokens: int | None | msgspec.UnsetType = msgspec.UNSET
    min_tokens: int = 0
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: int = 0  # vLLM's RequestOutputKind; here `stream` decides, as vLLM's generate sets it
    stream_interval: int | None = None  # tokens per streamed chunk (the server's --stream-interval a floor)
    flat_logprobs: bool = False  # vLLM's in-memory layout of logprobs: the answer's JSON is the same
    structured_outputs: StructuredOutputs | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logprobs: int | None = None  # [0, --max-logprobs]: vLLM's token-in shape (ids, logprob, rank)
    prompt_logprobs: int | None = None  # [0, --max-logprobs], not streamed: the response's prompt_logprobs
    # Refused unless at their defaults (None, or 0):
    prompt_logprob_token_ids: list[int] | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, Any] | None = None
    trace_decode_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    skip_reading_prefix_cache: bool | None = None
    routed_experts_prompt_start: int = 0


class TokenInRequest(msgspec.Struct, kw_only=True):
    token_ids: list[int]
    sampling_params: TokenSampling
    request_id: str | None = None
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    priority: int = 0
    return_text: bool = False  # this server's addition: each choice and chunk carries its text too
    features: dict[str, Any] | None = None  # multimodal: refused
    kv_transfer_params: dict[str, Any] | None = None  # disaggregated prefill: refused
    ec_transfer_params: dict[str, Any] | None = None
    assistant_tokens_mask: list[int] | None = None  # render's metadata about the prompt: no effect here
    token_offsets: list[list[int]] | None = None


_UNSUPPORTED = ("prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "extra_args",
                "thinking_token_budget", "repetition_detection", "trace_decode_token_ids", "truncate_prompt_tokens")
LOGITS_CONTROLS = ("logit_bias", "allowed_token_ids", "bad_words")


def _refuse(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


def check(req: TokenInRequest, vocab_size: int, max_logprobs: int) -> array[int]:
    """Every check that needs no engine; the prompt's ids. `max_logprobs`: the server's --max-logprobs."""
    for name in ("features", "kv_transfer_params", "ec_transfer_params"):
        if getattr(req, name) is not None:
            raise _refuse(name, "is not supported by this server (text prompts, no disaggregated serving)")
    _range(-(2**31) <= req.priority < 2**31, "priority", req.priority, "must be in [-2**31, 2**31)")
    ids = req.token_ids
    if not ids:
        raise _refuse("token_ids", "must not be empty")
    if not (0 <= min(ids) and max(ids) < vocab_size):
        i, bad = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise _refuse(f"token_ids[{i}]", f"token id {bad} is out of range [0, {vocab_size})")
    sp = req.sampling_params
    if sp.n != 1:  # as vLLM's generate route: one sequence per request
        raise _refuse(f"{PREFIX}.n", f"must be 1 on this route, got {sp.n}")
    for name, bound in BOUNDS.items():
        value = getattr(sp, name, None)
        if name != "n" and value is not None and value is not msgspec.UNSET:
            _range(bound.holds(value), f"{PREFIX}.{name}", value, bound.allowed)
    for name in ("logprobs", "prompt_logprobs"):
        count = getattr(sp, name)
        # vLLM's -1 (the whole vocabulary) is more than any --max-logprobs this server allows.
        _range(count is None or 0 <= count <= max_logprobs, f"{PREFIX}.{name}", count,
               f"must be in [0, {max_logprobs}] (the server's --max-logprobs)")
    if sp.prompt_logprobs is not None and req.stream:  # a stream's chunks have no place for them
        raise _refuse(f"{PREFIX}.prompt_logprobs", "are not available when `stream=True`.")
    for name in _UNSUPPORTED:
        if getattr(sp, name) is not None:
            raise _refuse(f"{PREFIX}.{name}", "is not supported by this server")
    if sp.skip_reading_prefix_cache:
        raise _refuse(f"{PREFIX}.skip_reading_prefix_cache", "is not supported by this server")
    if sp.routed_experts_prompt_start != 0:
        raise _refuse(f"{PREFIX}.routed_experts_prompt_start", "is not supported by this server")
    if not sp.spaces_between_special_tokens:
        raise _refuse(f"{PREFIX}.spaces_between_special_tokens", "false is not supported by this server")
    _range(0 <= sp.output_kind <= 2, f"{PREFIX}.output_kind", sp.output_kind, "must be 0, 1 or 2")
    _range(sp.stream_interval is None or sp.stream_interval >= 1, f"{PREFIX}.stream_interval", sp.stream_interval,
           "must be >= 1")
    for i, t in enumerate(sp.stop_token_ids or ()):
        _range(0 <= t < vocab_size, f"{PREFIX}.stop_token_ids[{i}]", t, f"token ids must be in [0, {vocab_size})")
    stops = stops_of(sp)
    if stops and not sp.detokenize:  # vLLM's rule: stop strings are matched on the text
        raise _refuse(f"{PREFIX}.stop", "stop strings need detokenize: true")
    _check_stop(stops)
    constraint(sp)  # its checks, early
    logit_bias(sp.logit_bias, vocab_size, f"{PREFIX}.logit_bias")
    allowed_token_ids(sp.allowed_token_ids, vocab_size, f"{PREFIX}.allowed_token_ids")
    bad_words(sp.bad_words, f"{PREFIX}.bad_words")
    return array("l", ids)


def _range(ok: bool, param: str, value: object, allowed: str) -> None:
    if not ok:
        raise APIError(400, f"{param}={value!r} is out of range: {allowed}", param=param)


def _check_stop(stops: list[str]) -> None:
    """The chat and completions routes' limits on stop strings (openai_schema.py, stop_strings.py)."""
    param = f"{PREFIX}.stop"
    if len(stops) > MAX_STOP_STRINGS:
        raise _refuse(param, f"{len(stops)} stop strings, at most {MAX_STOP_STRINGS} are allowed")
    chars = sum(map(len, stops))
    if chars > MAX_STOP_CHARS:
        raise _refuse(param, f"{chars} characters in all, at most {MAX_STOP_CHARS} are allowed")
    _range(all(stops), param, stops, "stop strings must not be empty")


def stops_of(sp: TokenSampling) -> list[str]:
    if sp.stop is None:
        return []
    return [sp.stop] if isinstance(sp.stop, str) else list(sp.stop)


def constraint(sp: TokenSampling) -> Constraint | None:
    """structured_outputs as its one constraint, checked as the chat route checks it."""
    so = sp.structured_outputs
    return None if so is None else from_structured_outputs(so, f"{PREFIX}.structured_outputs")


def logits_controls(sp: TokenSampling) -> list[str]:
    """The logits controls the request sets, as the 400 would name them."""
    return [f"{PREFIX}.{name}" for name in LOGITS_CONTROLS if getattr(sp, name)]


def engine_sampling(sp: TokenSampling, max_tokens: int, vocab_size: int) -> SamplingParams:
    """The engine's sampling parameters (protocol), as schema.sampling_params makes them for chat."""
    _range(sp.min_tokens <= max_tokens, f"{PREFIX}.min_tokens", sp.min_tokens, f"must be <= max_tokens ({max_tokens})")
    sampling = SamplingParams(
        max_tokens=max_tokens, temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0), min_p=sp.min_p,
        seed=sp.seed, min_tokens=sp.min_tokens, stop_token_ids=list(sp.stop_token_ids or ()),
        ignore_eos=sp.ignore_eos, presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty,
        logit_bias=logit_bias(sp.logit_bias, vocab_size, f"{PREFIX}.logit_bias"),
        allowed_token_ids=allowed_token_ids(sp.allowed_token_ids, vocab_size, f"{PREFIX}.allowed_token_ids"),
        bad_words=bad_words(sp.bad_words, f"{PREFIX}.bad_words"), logprobs=sp.logprobs,
        prompt_logprobs=sp.prompt_logprobs)
    c = constraint(sp)
    return sampling if c is None else msgspec.structs.replace(sampling, **{c.kind: c.value})
