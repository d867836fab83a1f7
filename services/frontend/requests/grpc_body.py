"""A gRPC GenerateRequest (protocol/grpc/fleet/v1/fleet.proto) as the /inference/v1/generate body it
stands for, so it passes the HTTP route's translation unchanged. Parsed where the HTTP body would be:
on the event loop when short, in a translation worker process when long (preparer.Preparer), since
protobuf's parse and the ids' conversion hold the GIL (a 4 MB request: ~140 ms).
"""
from __future__ import annotations

from typing import Any

import msgspec

from protocol.grpc import pb2

_SCALARS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "skip_special_tokens", "logprobs", "prompt_logprobs", "stream_interval")
_LISTS = ("stop", "stop_token_ids", "allowed_token_ids", "bad_words")
_FLAGS = ("ignore_eos", "include_stop_str_in_output", "min_tokens")


def parse(raw: bytes) -> Any:
    """The GenerateRequest in `raw`; raises ValueError (a message protobuf cannot read)."""
    try:
        return pb2.GenerateRequest.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not a fleet.v1.GenerateRequest: {exc}") from None


def token_in_body(req: Any, *, stream: bool) -> bytes:
    """The /inference/v1/generate JSON body a GenerateRequest stands for: set fields only, so every
    unset one takes vLLM's default and every check and error message is the HTTP route's."""
    sp = req.sampling_params
    params: dict[str, Any] = {name: getattr(sp, name) for name in _SCALARS if sp.HasField(name)}
    params.update({name: list(getattr(sp, name)) for name in _LISTS if getattr(sp, name)})
    params.update({name: getattr(sp, name) for name in _FLAGS if getattr(sp, name)})
    if sp.logit_bias:
        params["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
    if sp.HasField("structured_outputs"):
        kind = sp.structured_outputs.WhichOneof("kind")
        if kind is not None:
            value = getattr(sp.structured_outputs, kind)
            params["structured_outputs"] = {kind: list(value.choices) if kind == "choice" else value}
    body: dict[str, Any] = {"token_ids": list(req.token_ids), "sampling_params": params, "stream": stream,
                            "return_text": req.return_text, "priority": req.priority}
    if req.request_id:
        body["request_id"] = req.request_id
    if req.HasField("cache_salt"):
        body["cache_salt"] = req.cache_salt
    return msgspec.json.encode(body)
