"""The engine request a body becomes (EngineRequest: the message for the engine and its OutputOptions,
how its outputs become the response), and an engine's refusal told as the request field it is about.
Values only: made by the translator, read by placement, output processing and the writers."""
from __future__ import annotations

from typing import Any

import msgspec

from protocol import GenerateRequest
from protocol.block_hash import block_hashes


class OutputOptions(msgspec.Struct, frozen=True):
    """How a request's engine outputs become its response (for output processing and the writers). A
    frozen msgspec Struct, not a frozen dataclass: its 23 fields are set in ~0.5 us, where a frozen
    dataclass's __init__ (one object.__setattr__ a field) took ~9 us of every request's set-up."""

    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool  # every chunk carries the usage so far (vLLM's continuous_usage_stats)
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    tools: tuple[dict[str, Any], ...] = ()  # checked, as the request gave them
    tool_choice: str | dict[str, Any] = "none"  # "none", "auto", "required" or a named-function dict
    parallel_tool_calls: bool = True
    tool_parser: str | None = None  # the --tool-call-parser when this request's tool_choice is "auto"
    reasoning_parser: str | None = None  # the --reasoning-parser, for chat
    prompt_tail: str = ""  # the rendered prompt's end: whether the template opened the reasoning
    token_out: bool = False  # /inference/v1/generate: the response carries token ids (vLLM's shape)
    text_out: bool = False  # ... and their text as well (its return_text)
    response_id: str = ""  # the id the response names, when it is not the engine request's (the caller's)
    logprobs: int | None = None  # alternatives shown per generated token; None: no logprobs
    prompt_logprobs: int | None = None  # the engine's prompt_logprobs: the response's prompt_logprobs
    echo: str | None = None  # completions' echo: the prompt's text, returned before the completion
    return_tokens_as_token_ids: bool = False  # logprobs' tokens as "token_id:N" (vLLM's)
    # The request field an engine's refusal of `sampling.<name>` is about: where the structured-output
    # constraint came from (tool_choice, response_format, ...); other sampling fields keep their name,
    # after `param_prefix` ("sampling_params." on the token-in route).
    constraint_param: str | None = None
    param_prefix: str = ""
    # Tokens per streamed chunk (vLLM's stream_interval): the server's, or the request's if larger.
    stream_interval: int = 1


class EngineRequest(msgspec.Struct, frozen=True):
    """A checked request for one prompt, ready to place: the message for the engine, how to present
    its outputs, and `n`, the choices sampled from the prompt (choices(): one engine request each)."""

    request: GenerateRequest
    max_tokens: int
    output: OutputOptions
    n: int = 1

    def choices(self) -> list[EngineRequest]:
        """One engine request per choice, as vLLM fans `n` out: ids `<id>-<j>`, and with a seed choice j
        samples with seed + j (wrapped to 64 bits), so the choices differ and each is reproducible."""
        if self.n == 1:
            return [self]
        out = []
        sampling = self.request.sampling
        for j in range(self.n):
            seeded = sampling
            if sampling.seed is not None:
                seed = (sampling.seed + j + 2**63) % 2**64 - 2**63
                seeded = msgspec.structs.replace(sampling, seed=seed)
            child = msgspec.structs.replace(self.request, request_id=f"{self.request.request_id}-{j}", sampling=seeded)
            out.append(EngineRequest(child, self.max_tokens, self.output))
        return out

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    def block_hashes(self, block_size: int) -> list[int]:
        """The prompt's chained block hashes, as the engines' KV events name their blocks."""
        return block_hashes(self.request.prompt_token_ids, block_size, salt=self.request.cache_salt,
                            lora=self.request.lora)


_CONSTRAINTS = frozenset({"json_schema", "regex", "choice", "grammar", "json_object", "structural_tag"})


def refused_field(error: str, options: OutputOptions) -> tuple[str, str | None]:
    """An engine's refusal of its request ("sampling.grammar: ...") told as the request field it is
    about ("structured_outputs.grammar: ..."), with that field; other messages as they came."""
    head, sep, rest = error.partition(": ")
    name = head.removeprefix("sampling.")
    if not sep or name == head or not name.isidentifier():
        return error, None
    param = options.constraint_param if name in _CONSTRAINTS else options.param_prefix + name
    if param is None:
        return error, None
    return f"{param}: {rest}", param
