"""One pooling API request as the engines see it: its inputs, each one engine request, and how the
pooled outputs become the response body. Built by the route's translator (embeddings, pooling,
classify, score, rerank), run by the generation layer, in each API server process."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol import PoolingParams

# A pooled output as the engine sent it: a sequence's vector (embedding, class scores), or one row
# per token for the token-level tasks.
Pooled = list[float] | list[list[float]]


@dataclass(slots=True, frozen=True)
class PoolingInput:
    """One engine request: a text (or a text pair, for a cross-encoder) already tokenized."""

    token_ids: list[int]
    params: PoolingParams


@dataclass(slots=True)
class PoolingJob:
    """Every input of one API request (sent together, placed together) and the writer of its answer.

    `respond(outputs, prompt_tokens)` gets one pooled output per input, in input order, and the total
    prompt tokens, and returns the JSON body (vLLM's shape for the route)."""

    task: str  # the pooling task every input runs: embed, classify, token_embed, token_classify
    inputs: list[PoolingInput]
    respond: Callable[[list[Pooled], int], dict[str, Any]]
    lora: str | None = None
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # route-specific facts for logs
    # Where an engine's refusal points in the body: each engine request's field ("input[3]", "texts[0]",
    # "documents[2]"; none: "input" or "input[i]"), and the body's name for an engine pooling field
    # the body sets ("dimensions" -> "output_dimension" on /v2/embed).
    input_names: list[str] = field(default_factory=list)
    field_names: dict[str, str] = field(default_factory=dict)

    def param_of(self, index: int, message: str) -> str:
        """The body field an engine refusal of request `index` names: the pooling field its message
        starts with ("pooling.dimensions=8: ..."), else the input's field. token_type_split is the
        frontend's own, set from the input, so it names the input."""
        head = message.split("=", 1)[0].split(":", 1)[0]
        if head.startswith("pooling.") and head != "pooling.token_type_split":
            name = head.removeprefix("pooling.")
            return self.field_names.get(name, name)
        if index < len(self.input_names):
            return self.input_names[index]
        return f"input[{index}]" if len(self.inputs) > 1 else "input"

