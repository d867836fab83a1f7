"""Config types of the System One side of the router (read by config/systemone.py at start): a native
recipe's budget and confidence acceptance, and the LLM judge both escalate algorithms may ask.
Defaults are written here only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# What a published System One model answers, by family (a deployment's tasks decide it: embed ->
# embedding, classify -> classifier, score or rerank alone -> cross_encoder).
FAMILIES = ("classifier", "embedding", "cross_encoder")
# What a chat pool produces: text (chat, completions, Responses, Messages), or images (/v1/images/generations).
OUTPUTS = ("text", "image")
# How an attached deployment's workers are spoken to: vLLM's pooling API (/classify, /v1/embeddings,
# /rerank), or the System One API (POST /v1/systemone) of an engine-mode router or another compatible server.
ATTACHED_APIS = ("pooling", "systemone")


@dataclass(frozen=True, slots=True)
class Budget:
    """One request's budget: every signal and stage call shares the deadline and the call cap."""

    deadline_s: float = 10.0
    max_calls: int = 3


@dataclass(frozen=True, slots=True)
class JudgeConfig:
    """An LLM (a chat pool) that may pick one of the complete answers already received, or abstain."""

    pool: str
    timeout_s: float = 10.0  # within the request's deadline: whichever ends first
    # The most judge calls one request makes: a native recipe asks once per input no stage was
    # confident on (the others keep their last stage's answer); a chat escalate asks at most once.
    max_calls: int = 4


@dataclass(frozen=True, slots=True)
class ConfidenceAccept:
    """A stage's answer is accepted when the model is confident: its top class probability (a
    cross-encoder: its best score) is at least min_probability, and exceeds the runner-up's by at least
    min_margin."""

    min_probability: float = 0.0
    min_margin: float = 0.0


@dataclass(frozen=True, slots=True)
class NativeEscalateAlgorithm:
    """A native (api: systemone) recipe's algorithm: the matching decision's stages (deployments), the
    fast one first; a later one only for the inputs whose answer failed `accept`."""

    type: ClassVar[str] = "escalate"
    accept: ConfidenceAccept = ConfidenceAccept()
    judge: JudgeConfig | None = None
