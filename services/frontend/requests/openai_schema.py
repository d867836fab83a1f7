"""OpenAI request bodies (chat completions, completions) as typed structs, and their range checks.

Decoding with msgspec validates types in one pass and names the field on error; the checks here add
the allowed ranges. Every field of OpenAI's and vLLM's requests is declared, so that each is honoured
or refused by name (refusals.py; docs/request-fields.md is the table), and a field neither declares is
a 400 naming it, where vLLM logs a warning and ignores it: a misspelt `respone_format` must not give
free text to a client that asked for JSON.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from protocol import SamplingParams
from services.frontend.errors import APIError
from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's
    include_obfuscation: bool | None = None  # OpenAI's (refusals.py)


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, omit_defaults=True):
    """A message as sent; `messages.py` checks its shape per role and makes the template's dict."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


# ---- structured outputs (structured.py reads them) ----

class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    """response_format.json_schema, as OpenAI defines it (vLLM requires the name too)."""

    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonSchemaResponseFormat(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    json_schema: JsonSchemaFormat


class StructuralTagFormat(msgspec.Struct, tag="structural_tag", tag_field="type", forbid_unknown_fields=True,
                          omit_defaults=True):
    """vLLM's structural tag: xgrammar's `format`, or the legacy `structures` with `triggers`."""

    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat | StructuralTagFormat


class StructuredOutputsParams(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's `structured_outputs` (its StructuredOutputsParams' public fields)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class _Sampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields both endpoints share, OpenAI's first, then vLLM's (in their protocol.py's order)."""

    model: str
    stream: bool | None = False  # null is false, as in vLLM and OpenAI
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    cache_salt: str | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's
    use_beam_search: bool = False
    watermarking: bool | None = None
    length_penalty: float = 1.0
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None  # the prompt's logprobs, in the response's prompt_logprobs
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    request_id: str | None = None
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None  # logprobs' tokens as "token_id:N"
    return_token_ids: bool | None = None
    routed_experts_prompt_start: int = 0
    return_token_offsets: bool | None = False
    mm_payload: str = "tensors"
    return_mm_kwargs: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    stream_interval: int | None = None
    # vLLM's before 0.12 (structured_outputs replaced them): honoured as structured_outputs' fields.
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    # Shapes checked in `tools.py`; kept as given, since the template renders them as they came.
    tools: list[dict[str, Any]] | None = None
    # UNSET (absent) means "auto" beside tools, as in vLLM; an explicit null means "none".
    tool_choice: str | dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    include_reasoning: bool = True
    echo: bool = False
    add_special_tokens: bool = False  # the chat template adds them (vLLM's default for chat)
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    # OpenAI's that vLLM does not declare
    audio: dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    moderation: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None


class CompletionRequest(_Sampling, kw_only=True):
    # str, token ids, or a one-element list of either (msgspec allows one array type in a union).
    prompt: str | list[Any]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    add_special_tokens: bool = True
    best_of: int | None = None
    prompt_embeds: str | list[str] | None = None


def _range(ok: bool, param: str, value: object, allowed: str) -> None:
    if not ok:
        raise APIError(400, f"{param}={value!r} is out of range: {allowed}", param=param)


@dataclass(frozen=True, slots=True)
class Bounds:
    """A number field's allowed range, checked by `check_common` and told by the OpenAPI document."""

    low: float | None
    high: float | None
    allowed: str  # as the 400 tells it
    low_open: bool = False  # `low` itself is out of range

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or value <= self.high)

    def json_schema(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["maximum"] = self.high
        return out


# In the order they are checked; a field that is null (absent) is not.
BOUNDS: dict[str, Bounds] = {
    "n": Bounds(1, None, "must be >= 1"),  # and n times the prompts at most --max-request-choices
    "temperature": Bounds(0, 2, "must be in [0, 2]"),
    "top_p": Bounds(0, 1, "must be in (0, 1]", low_open=True),
    "top_k": Bounds(-1, 2**31 - 1, "must be -1 or 0 (disabled) or in [1, 2**31)"),
    "priority": Bounds(-(2**31), 2**31 - 1, "must be in [-2**31, 2**31)"),
    "min_p": Bounds(0, 1, "must be in [0, 1]"),
    "max_tokens": Bounds(1, None, "must be >= 1"),
    "min_tokens": Bounds(0, None, "must be >= 0"),
    "presence_penalty": Bounds(-2, 2, "must be in [-2, 2]"),
    "frequency_penalty": Bounds(-2, 2, "must be in [-2, 2]"),
    "repetition_penalty": Bounds(0, 2, "must be in (0, 2]", low_open=True),
    "seed": Bounds(-(2**63), 2**63 - 1, "must fit in 64 bits"),
    "stream_interval": Bounds(1, None, "must be >= 1 (tokens per streamed chunk)"),
}
# The OpenAI routes' own (not the token-in route's sampling_params, which refuses truncation): and not 0
# (translation checks it: it would leave no prompt); its upper limit is the context length.
PROMPT_BOUNDS = {"truncate_prompt_tokens": Bounds(-1, None, "must be -1 (as many as the context holds) or >= 1")}
CHAT_BOUNDS = {"max_completion_tokens": Bounds(1, None, "must be >= 1")}  # checked by the Translator


def check_bounds(req: msgspec.Struct, bounds: dict[str, Bounds]) -> None:
    for name, bound in bounds.items():
        value = getattr(req, name)
        if value is not None:
            _range(bound.holds(value), name, value, bound.allowed)


def check_common(req: _Sampling) -> None:
    if req.stream_options is not None and not req.stream:  # vLLM's check and message
        raise APIError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    check_bounds(req, BOUNDS)
    check_bounds(req, PROMPT_BOUNDS)
    _check_stop(stop_list(req))


def check_logprobs(req: ChatCompletionRequest | CompletionRequest, max_logprobs: int) -> None:
    """Each count in [0, --max-logprobs], and vLLM's rules with vLLM's messages: top_logprobs needs
    logprobs (chat), prompt_logprobs cannot stream."""
    allowed = f"must be in [0, {max_logprobs}] (the server's --max-logprobs)"
    count = req.top_logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs
    name = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
    if count is not None:
        _range(0 <= count <= max_logprobs, name, count, allowed)
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs and not req.logprobs:
        raise APIError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    if req.prompt_logprobs is not None:
        _range(0 <= req.prompt_logprobs <= max_logprobs, "prompt_logprobs", req.prompt_logprobs, allowed)
        if req.stream:
            raise APIError(400, "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")


def _check_stop(stops: list[str]) -> None:
    """The limits that keep preparing a request's stop strings cheap (stop_strings.py says why)."""
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop: {len(stops)} stop strings, at most {MAX_STOP_STRINGS} are allowed", param="stop")
    chars = sum(map(len, stops))
    if chars > MAX_STOP_CHARS:
        raise APIError(400, f"stop: {chars} characters in all, at most {MAX_STOP_CHARS} are allowed", param="stop")
    _range(all(stops), "stop", stops, "stop strings must not be empty")


def stop_list(req: _Sampling) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def sampling_params(req: _Sampling, max_tokens: int, vocab_size: int) -> SamplingParams:
    """The engine's sampling settings; the structured-output constraint is translation's to add."""
    stop_ids = req.stop_token_ids or []
    for i, t in enumerate(stop_ids):
        _range(0 <= t < vocab_size, f"stop_token_ids[{i}]", t, f"token ids must be in [0, {vocab_size})")
    _range(req.min_tokens <= max_tokens, "min_tokens", req.min_tokens, f"must be <= max_tokens ({max_tokens})")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None else max(req.top_k, 0),
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        min_tokens=req.min_tokens,
        stop_token_ids=list(stop_ids),
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=logit_bias(req.logit_bias, vocab_size),
        allowed_token_ids=allowed_token_ids(req.allowed_token_ids, vocab_size),
        bad_words=bad_words(req.bad_words),
    )


LOGITS_CONTROLS = ("logit_bias", "allowed_token_ids", "bad_words")  # the fields only the vllm backend honours


def logits_controls(req: _Sampling) -> list[str]:
    """The logits controls a request sets (each needs engines that honour it)."""
    return [name for name in LOGITS_CONTROLS if getattr(req, name)]


def logit_bias(bias: dict[str, float] | None, vocab_size: int, param: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI's map of token ids (JSON object keys, so strings) to a bias in [-100, 100]."""
    if bias is None:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(400, f"{param}: key {key!r} is not a token id", param=param) from None
        if not 0 <= token < vocab_size:
            raise APIError(400, f"{param}: token id {token} is out of range [0, {vocab_size})", param=param)
        if not -100 <= value <= 100:  # OpenAI's range; vLLM clamps instead, which hides a client's mistake
            raise APIError(400, f"{param}: the bias of token {token} is {value}: must be in [-100, 100]", param=param)
        out[token] = float(value)
    return out or None


def allowed_token_ids(ids: list[int] | None, vocab_size: int, param: str = "allowed_token_ids") -> list[int] | None:
    if ids is None:
        return None
    if not ids:  # vLLM's rule: an empty list would allow nothing
        raise APIError(400, f"{param}: must list at least one token id (or be omitted)", param=param)
    for i, t in enumerate(ids):
        _range(0 <= t < vocab_size, f"{param}[{i}]", t, f"token ids must be in [0, {vocab_size})")
    return list(ids)


def bad_words(words: list[str] | None, param: str = "bad_words") -> list[str]:
    for i, word in enumerate(words or ()):
        if not word.strip():  # vLLM's rule: a word must tokenize to at least one token
            raise APIError(400, f"{param}[{i}]: must not be empty or only whitespace", param=f"{param}[{i}]")
    return list(words or ())
