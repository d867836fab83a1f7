"""The request fields this server refuses, each with the values that ask for nothing and the reason a
400 gives for any other value. Runs in each API server process (and its workers), from translation.

The rule (docs/request-fields.md holds the whole table): every field of OpenAI's and vLLM's chat and
completion requests is honoured or refused by name, never ignored; a field that only annotates the
request for the provider's own records (`user`, `metadata`, ...) is accepted and changes nothing,
as it changes nothing in the answer at OpenAI or vLLM either.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.frontend.errors import APIError

NOT_YET = "is not supported by this server yet"
BEAM = "beam search is not supported by this server (vLLM serves it outside its engine loop)"
MULTIMODAL = "this server serves text only: no images, audio or video"
DISAGGREGATED = "disaggregated prefill and encoder-cache transfer are not supported by this server"
RENDER_ONLY = "belongs to vLLM's render endpoints; a generation request answers with text, not a render"


@dataclass(frozen=True, slots=True)
class Refusal:
    unset: Callable[[Any], bool]  # whether a value asks for nothing (the default or its equivalents)
    why: str  # completes "FIELD: ..." in the 400


def _none(value: Any) -> bool:
    return value is None


def _falsy(value: Any) -> bool:
    return not value


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


# Both endpoints: vLLM's fields this server does not have.
COMMON: dict[str, Refusal] = {
    "logprob_token_ids": Refusal(_none, f"logprobs of chosen token ids {NOT_YET}"),
    "return_token_ids": Refusal(_falsy, f"token ids in the response {NOT_YET}"),
    "use_beam_search": Refusal(_falsy, BEAM),
    "length_penalty": Refusal(_one_of(1.0), "only beam search reads it: " + BEAM),
    "watermarking": Refusal(_falsy, "output watermarking is not supported by this server"),
    "routed_experts_prompt_start": Refusal(_one_of(0), "routed-expert data is not returned by this server"),
    "return_token_offsets": Refusal(_falsy, RENDER_ONLY),
    "mm_payload": Refusal(_one_of("tensors"), RENDER_ONLY),
    "return_mm_kwargs": Refusal(_none, RENDER_ONLY),
    "kv_transfer_params": Refusal(_none, DISAGGREGATED),
    "ec_transfer_params": Refusal(_none, DISAGGREGATED),
    "vllm_xargs": Refusal(_none, "this server runs no vLLM extensions that would read them"),
    "repetition_detection": Refusal(_none, f"vLLM's repetition detection {NOT_YET}"),
    "thinking_token_budget": Refusal(_one_of(None, -1), "a thinking budget needs vLLM's --reasoning-config in "
                                                        "the engine, which this server does not pass"),
    "guided_whitespace_pattern": Refusal(_none, "xgrammar, the engines' structured-output backend, takes no "
                                                "whitespace pattern (JSON is always compact here)"),
}

CHAT: dict[str, Refusal] = {
    "echo": Refusal(_falsy, f"echo {NOT_YET} on chat (completions echo their prompt)"),
    "include_reasoning": Refusal(_one_of(True), f"dropping the reasoning from the response {NOT_YET}"),
    "chat_template": Refusal(_none, "Chat template is passed with request, but --trust-request-chat-template "
                                    "is not set. Refused request with untrusted chat template."),  # vLLM's words
    "media_io_kwargs": Refusal(_none, MULTIMODAL),
    "mm_processor_kwargs": Refusal(_none, MULTIMODAL),
    "return_prompt_text": Refusal(_falsy, f"the rendered prompt in the response {NOT_YET}"),
    "audio": Refusal(_none, MULTIMODAL),
    "modalities": Refusal(lambda v: v is None or v == ["text"], MULTIMODAL),
    "function_call": Refusal(_none, "the deprecated functions API is not supported: use tools and tool_choice"),
    "functions": Refusal(_none, "the deprecated functions API is not supported: use tools and tool_choice"),
    "moderation": Refusal(_none, "this server runs no moderation"),
    "prediction": Refusal(_none, "predicted outputs are not supported by this server"),
    "prompt_cache_options": Refusal(_none, "the prefix cache here is automatic and in memory; it takes no options"),
    "prompt_cache_retention": Refusal(_one_of(None, "in_memory"), "the prefix cache here is in memory only"),
    "service_tier": Refusal(_one_of(None, "auto", "default"), "this server has one tier (see `priority`)"),
    "store": Refusal(_falsy, "this server stores no completions"),
    "verbosity": Refusal(_none, "not supported by this server (it is not a model input here)"),
    "web_search_options": Refusal(_none, "this server has no web search"),
}

COMPLETION: dict[str, Refusal] = {
    "suffix": Refusal(_none, f"suffix {NOT_YET}"),
    # vLLM V1's answer ("vLLM V1 does not yet support best_of") before vLLM 0.32 dropped the field.
    "best_of": Refusal(_one_of(None, 1), "best_of above 1 is not supported, as in vLLM V1 (no extra candidates "
                                         "are sampled and ranked): ask for n choices and rank them by their "
                                         "logprobs"),
    "prompt_embeds": Refusal(_none, "prompt embeddings are not supported by this server: send text or token ids"),
}


# Per table: its fields' getter, and value tuples already found to ask for nothing (nearly every request
# sends the same: the defaults), so a request that sends one of them is passed on one C-level getter and a
# tuple comparison, not ~30 getattr and predicate calls. `unset` depends on the value alone, and the values
# are decoded JSON (no custom equality), so a tuple equal to a passed one passes.
_PASSED: dict[int, tuple[Callable[[Any], tuple[Any, ...]], list[tuple[Any, ...]]]] = {}
_KEPT = 8  # value tuples kept per table


def check(req: Any, table: dict[str, Refusal]) -> None:
    """A 400 naming the first field of `table` that asks for something this server does not do."""
    known = _PASSED.get(id(table))
    if known is None:
        known = _PASSED[id(table)] = (_values_of(tuple(table)), [])
    values = known[0](req)
    if values in known[1]:
        return
    for name, refusal in table.items():
        if not refusal.unset(getattr(req, name)):
            raise APIError(400, f"{name}: {refusal.why}", param=name)
    if len(known[1]) < _KEPT:
        known[1].append(values)


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda req: (get(req),)


def _check_common(req: Any) -> None:
    check(req, COMMON)
    if req.stream_options is not None and req.stream_options.include_obfuscation:
        raise APIError(400, "stream_options.include_obfuscation: this server pads no stream events with an "
                       "obfuscation field", param="stream_options.include_obfuscation")
    if not req.spaces_between_special_tokens and not req.skip_special_tokens:
        # vLLM reads it only when special tokens are kept; this server joins them as the tokenizer decodes them.
        raise APIError(400, "spaces_between_special_tokens: false is not supported by this server yet (special "
                       "tokens are joined as the tokenizer decodes them)", param="spaces_between_special_tokens")


def check_chat(req: Any) -> None:
    _check_common(req)
    check(req, CHAT)


def check_completion(req: Any) -> None:
    _check_common(req)
    check(req, COMPLETION)
