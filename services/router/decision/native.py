"""A native System One recipe run for one request (router process, on its event loop): the matching
decision's stages (deployments) called in order under one budget, each input escalated alone: a later
stage answers only the inputs whose answer failed the confidence condition; an optional judge may pick
one of the complete answers of an input no stage was confident on, or abstain. What the client gets is
always some stage's own output."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.router.config import EntryConfig
from services.router.runtime.models import DecisionModels, Label

if TYPE_CHECKING:
    from services.router.decision.engine import Router
    from services.router.decision.judge import JudgeCaller


@dataclass(slots=True, frozen=True)
class NativeInput:
    """What the request asks, by family: classifier texts, or a cross-encoder's query and documents
    (one input: its scores are judged together)."""

    family: str  # classifier | cross_encoder
    texts: tuple[str, ...] = ()
    query: str = ""
    documents: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class StageOutput:
    stage: str  # the deployment that answered
    output: Label | tuple[float, ...]  # a classifier's label and probabilities, or a cross-encoder's scores
    accepted: bool  # passed the recipe's confidence condition
    reason: str | None  # why not, when not


@dataclass(slots=True, frozen=True)
class ItemResult:
    """One input's answer: `chosen` is what the client gets; `answers` every stage's, in order."""

    chosen: StageOutput
    answers: tuple[StageOutput, ...]
    judge: str | None  # None: not asked; "chose" (it picked `chosen`) or "abstained" (or it failed: why)


@dataclass(slots=True, frozen=True)
class RecipeResult:
    items: tuple[ItemResult, ...]  # one per text (classifier), or one (cross-encoder)
    stages_called: tuple[str, ...]  # in order, one per stage call
    calls: int  # model calls counted against the budget: signal calls and stage calls
    judge_calls: int
    prompt_tokens: int  # summed over the stage calls' usage
    deadline_s: float  # the budget that applied (the entry's, tightened by the decision's)
    max_calls: int


async def run(entry: EntryConfig, inp: NativeInput, *, router: Router, models: DecisionModels,
              judge: JudgeCaller | None) -> RecipeResult:
    """The recipe `entry` (api: systemone) run for one request; ModelUnavailable (with its status) when
    no stage answered within the budget."""
    raise NotImplementedError("native recipes are being built")
