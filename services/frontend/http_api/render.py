"""POST /v1/chat/completions/render and /v1/completions/render: a translated request (requests/translator.py)
written as the token-in request /inference/v1/generate takes, in vLLM's shape (its disagg
GenerateRequest, the completions one in a list). Runs in each API server process, on its event loop.

`sampling_params` is vLLM's SamplingParams as vLLM serializes it, fields at their defaults left out,
with one exception: `max_tokens` is always written. vLLM's default for it is 16 while its generate
route reads an absent max_tokens as the rest of the context, so a rendered max_tokens of 16 would
come back as something else.
"""
from __future__ import annotations

from typing import Any

import msgspec

from protocol import SamplingParams
from services.frontend.requests.engine_request import EngineRequest

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
_FINAL_ONLY, _DELTA = 2, 1  # vLLM's RequestOutputKind, which its render sets from `stream`
# vLLM's SamplingParams defaults of the fields the engines honour (protocol.SamplingParams' names).
# logprobs and prompt_logprobs are the request's as vLLM's to_sampling_params sets them (chat's
# top_logprobs once logprobs is true; an echoed completion's prompt_logprobs default to its logprobs).
_DEFAULTS: dict[str, Any] = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                             "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
                             "ignore_eos": False, "min_tokens": 0, "logprobs": None, "prompt_logprobs": None}


def generate_request(request: EngineRequest, model: str, *, own_id: bool = False) -> dict[str, Any]:
    """The token-in request (vLLM's GenerateRequest) that generates what `request` would; `own_id`:
    named by its engine request's id (a batch's prompt), not the response's."""
    options = request.output
    stream_options = None
    if options.stream:
        stream_options = {"include_usage": options.include_usage, "continuous_usage_stats": options.continuous_usage}
    engine = request.request
    request_id = engine.request_id if own_id else options.response_id or engine.request_id
    return {"request_id": request_id, "token_ids": engine.prompt_token_ids,
            "assistant_tokens_mask": None, "token_offsets": None, "features": None,
            "sampling_params": sampling_params(engine.sampling, request, _DELTA if options.stream else _FINAL_ONLY),
            "model": model, "stream": options.stream, "stream_options": stream_options,
            "cache_salt": engine.cache_salt, "priority": engine.priority, "kv_transfer_params": None,
            "ec_transfer_params": None}


def sampling_params(sampling: SamplingParams, request: EngineRequest, output_kind: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(sampling, name) for name, default in _DEFAULTS.items()
                           if getattr(sampling, name) != default}
    out["max_tokens"] = sampling.max_tokens
    if request.n != 1:  # as vLLM renders it (its token-in route, like this one, takes n=1 only)
        out["n"] = request.n
    options = request.output
    if options.stop:
        out["stop"] = list(options.stop)
    if sampling.stop_token_ids:
        out["stop_token_ids"] = list(sampling.stop_token_ids)
    if not options.skip_special_tokens:
        out["skip_special_tokens"] = False
    if options.include_stop_str_in_output:
        out["include_stop_str_in_output"] = True
    out["output_kind"] = output_kind
    if sampling.json_schema is not None:
        out["structured_outputs"] = {"json": _decode.decode(sampling.json_schema)}
    for name in ("regex", "choice", "grammar", "structural_tag"):  # as vLLM's StructuredOutputsParams names them
        if getattr(sampling, name) is not None:
            out["structured_outputs"] = {name: getattr(sampling, name)}
    if sampling.json_object:
        out["structured_outputs"] = {"json_object": True}
    if sampling.logit_bias is not None:
        out["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    if sampling.allowed_token_ids is not None:
        out["allowed_token_ids"] = list(sampling.allowed_token_ids)
    if sampling.bad_words:
        out["bad_words"] = list(sampling.bad_words)
    return out


def chat_body(request: EngineRequest, model: str) -> bytes:
    return _json.encode(generate_request(request, model))


def completion_body(requests: list[EngineRequest], model: str) -> bytes:
    """A list, as vLLM's: one entry per prompt."""
    batch = len(requests) > 1
    return _json.encode([generate_request(request, model, own_id=batch) for request in requests])
