"""The request fields vLLM's classify, score and rerank bodies share (its PoolingBasicRequestMixin and
`use_activation`), their checks, and the parts of a response they share (id, usage). Runs in each API
server process, from the classify and scoring translators."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import msgspec

from services.frontend.errors import APIError

# vLLM sets no bound on the inputs of one call; thousands of engine requests queued by one client ahead
# of everyone else is a denial of service, so this server refuses past it, naming the field and the
# limit (OpenAI's bound on an embeddings call).
MAX_INPUTS = 2048
_RENAMED = "was removed; use `use_activation` instead."  # vLLM's words for `normalize`


class PoolingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's names and defaults; decoding refuses a field neither vLLM nor this struct declares."""

    model: str | None = None
    user: str | None = None  # annotates the request only, as at vLLM
    truncate_prompt_tokens: int | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    priority: int = 0
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    use_activation: bool | None = None
    # vLLM's earlier names for use_activation: refused with the name to use.
    normalize: Any | msgspec.UnsetType = msgspec.UNSET
    activation: Any | msgspec.UnsetType = msgspec.UNSET
    softmax: Any | msgspec.UnsetType = msgspec.UNSET


def check(req: PoolingFields, max_model_len: int) -> int | None:
    """A 400 naming the first shared field this server cannot honour; else how many tokens a prompt
    keeps (truncate_prompt_tokens, -1 made the whole context: a pooling request generates nothing)."""
    for old in ("normalize", "activation", "softmax"):
        if getattr(req, old) is not msgspec.UNSET:
            raise APIError(400, f"Parameter `{old}` {_RENAMED}", param=old)
    if req.padding == "max_length":
        raise APIError(400, "padding: 'max_length' is not supported by this server yet (only models trained "
                       "without an attention mask need it); send 'do_not_pad' or leave it out", param="padding")
    if req.mm_processor_kwargs is not None:
        raise APIError(400, "mm_processor_kwargs: this server serves text only", param="mm_processor_kwargs")
    if req.cache_salt is not None:
        raise APIError(400, "cache_salt: not carried by this server's pooling requests yet", param="cache_salt")
    check_priority(req.priority)
    return keep_tokens(req.truncate_prompt_tokens, max_model_len)


def keep_tokens(keep: int | None, max_model_len: int) -> int | None:
    """truncate_prompt_tokens checked as vLLM checks it: how many tokens a prompt keeps (-1 made the whole
    context: a pooling request generates nothing), None for all."""
    if keep is None:
        return None
    if keep < -1 or keep == 0:
        raise APIError(400, f"truncate_prompt_tokens={keep}: must be -1 (the whole context) or >= 1",
                       param="truncate_prompt_tokens")
    if keep > max_model_len:  # vLLM's check and its words
        raise APIError(400, f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = "
                       f"{max_model_len}. Please request a smaller truncation size.", param="truncate_prompt_tokens")
    return max_model_len if keep == -1 else keep


def check_priority(priority: int) -> None:
    """The generation routes' bound on `priority` (openai_schema.py): past it the engine's scheduler
    cannot hold the value, and the request would fail there as a 500."""
    if not -(2**31) <= priority < 2**31:
        raise APIError(400, f"priority={priority!r} is out of range: must be in [-2**31, 2**31)", param="priority")


def check_count(param: str, count: int, max_inputs: int) -> None:
    if count > max_inputs:
        raise APIError(400, f"{param}: {count} inputs in one call; at most {max_inputs} are allowed (split "
                       "the batch into several calls)", param=param)


def check_length(param: str, length: int, max_model_len: int) -> None:
    """vLLM's refusal of a prompt past the context, naming the input and the field that would cut it."""
    if length > max_model_len:
        raise APIError(400, f"{param}: This model's maximum context length is {max_model_len} tokens. However, "
                       f"this input contains {length} input tokens, which exceeds this limit. Please reduce "
                       "the length of the input, or set truncate_prompt_tokens.", param=param)


def response_id(req: PoolingFields, prefix: str, header: str | None) -> str:
    """vLLM's response id: the route's prefix and the X-Request-Id header, else the body's request_id,
    else a random one."""
    base = header if header is not None else req.request_id
    return f"{prefix}-{base if base is not None else uuid.uuid4().hex}"


def created() -> int:
    return int(time.time())


def usage(prompt_tokens: int) -> dict[str, Any]:
    """vLLM's UsageInfo as its responses dump it (every key, null ones too)."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
            "prompt_tokens_details": None, "completion_tokens_details": None}
