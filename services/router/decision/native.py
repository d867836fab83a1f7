"""A native System One recipe run for one request (router process, on its event loop): the matching
decision's stages (deployments) called in order under one budget, each input escalated alone: a later
stage answers only the inputs whose answer failed the confidence condition; an optional judge may pick
one of the complete answers of an input no stage was confident on, or abstain. What the client gets is
always some stage's own output.

One budget bounds the request from the moment `run` is called: its deadline covers the signals, every
stage and the judge; its call cap counts the model signals' calls (one per deployment they used; the
in-process embedder is no call) and every stage call, failed ones too. Judge calls count toward the
deadline only, not the call cap: the judge is asked only after the stages, about answers already paid
for, and is bounded by its own timeout."""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.router.config import (
    MODEL_SIGNAL_TYPES,
    Budget,
    EntryConfig,
    JudgeConfig,
    NativeEscalateAlgorithm,
    uses_local_embedder,
)
from services.router.decision import judge as judging
from services.router.decision.confidence import verdict
from services.router.runtime.models import DecisionModels, Label, ModelUnavailable

log = logging.getLogger("router")

ESCALATING = ("classifier", "cross_encoder")  # the families a recipe may have: an embedding has no confidence
DOCUMENT_CHARS = 300  # of each document, in what the judge is shown of a cross-encoder's input

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
    judge: str | None  # None: not asked; "chose" (it picked `chosen`) or "abstained" (abstained, failed, garbled)
    judge_detail: str | None = None  # why the judge abstained: its garbled reply, or its failure


@dataclass(slots=True, frozen=True)
class RecipeResult:
    items: tuple[ItemResult, ...]  # one per text (classifier), or one (cross-encoder)
    stages_called: tuple[str, ...]  # in order, one per stage call
    calls: int  # model calls counted against the budget: signal calls and stage calls
    judge_calls: int
    prompt_tokens: int  # summed over the stage calls' usage
    deadline_s: float  # the budget that applied (the entry's, tightened by the decision's)
    max_calls: int
    decision: str = ""  # the decision whose stages ran ("default" when none matched)


async def run(entry: EntryConfig, inp: NativeInput, *, router: Router, models: DecisionModels,
              judge: JudgeCaller | None, offload: bool = False) -> RecipeResult:
    """The recipe `entry` (api: systemone) run for one request; ModelUnavailable (with its status) when
    no stage answered within the budget.

    Stage 1 gets every input in one call; each later stage, in the decision's order, one call with the
    inputs no stage has accepted yet. The stages stop when every input is accepted, they run out, the
    call cap is reached or the deadline passes (a call still running then is cancelled). A stage that
    fails is skipped: the next one gets its inputs. An input no answer was accepted for goes to the
    judge, if the recipe has one and time is left (one call per such input, for the first
    judge.max_calls of them, all at once, each within the judge's timeout and the deadline left); it
    gets the answer the judge chose, or the last stage's answer when the judge abstained, failed,
    replied anything but an option or was not asked. A stage's refusal of the input (400) ends the
    escalation: no later stage is asked what the client must change."""
    algorithm = entry.algorithm
    if not isinstance(algorithm, NativeEscalateAlgorithm):
        raise TypeError(f"entries.{entry.name}: not a native recipe (api: systemone); algorithm {algorithm!r}")
    if inp.family not in ESCALATING:
        raise ValueError(f"family: expected one of {', '.join(ESCALATING)}, got {inp.family!r}")
    n = len(inp.texts) if inp.family == "classifier" else 1
    if n == 0 or (inp.family == "cross_encoder" and not inp.documents):
        raise ModelUnavailable(f"{'input' if inp.family == 'classifier' else 'documents'}: nothing to answer", 400)
    loop = asyncio.get_running_loop()
    start = loop.time()  # the loop's clock, the one its timers fire by
    budget = entry.budget or Budget()
    # 1. Signals and the decision: the signal budget ends with the request's deadline at the latest.
    text = "\n".join(inp.texts) if inp.family == "classifier" else inp.query
    left = budget.deadline_s - (loop.time() - start)
    choice = await router.choose({"model": entry.name}, text, offload=offload, signal_budget_s=max(0.0, left))
    calls = signal_calls(entry, choice.signals)
    budget = tightened(budget, entry, None if choice.decision.matched_default else choice.decision.name)
    deadline = start + budget.deadline_s
    # 2. The stages, each on the inputs still unaccepted.
    answers: list[list[StageOutput]] = [[] for _ in range(n)]
    pending = list(range(n))
    called: list[str] = []
    failures: list[str] = []
    last: ModelUnavailable | None = None  # the last stage failure: its status, and a refusal's words
    tokens = 0
    for stage in choice.plan:
        if not pending:
            break
        if calls >= budget.max_calls:
            failures.append(f"stage {stage!r} not called: the call cap ({budget.max_calls} calls) was reached")
            break
        left = deadline - loop.time()
        if left <= 0:
            failures.append(f"stage {stage!r} not called: the deadline ({budget.deadline_s:g} s) passed")
            break
        calls += 1
        called.append(stage)
        try:
            async with asyncio.timeout_at(deadline):
                outputs, used = await _stage_call(models, stage, inp, pending, left)
        except TimeoutError:
            failures.append(f"stage {stage!r}: no answer within the deadline ({budget.deadline_s:g} s)")
            last = ModelUnavailable(failures[-1], 504)
            continue
        except ModelUnavailable as exc:
            last = exc
            failures.append(f"stage {stage!r}: {exc}")
            log.info("recipe %s: stage %s failed: %s", entry.name, stage, exc)
            if exc.status == 400:  # the input itself was refused (too long for that model): no later
                break  # stage is asked to answer what the client must change
            continue
        tokens += used
        still = []
        for i, output in zip(pending, outputs, strict=True):
            why = verdict(algorithm.accept, output)
            answers[i].append(StageOutput(stage, output, why is None, why))
            if why is not None:
                still.append(i)
        if still and len(called) < len(choice.plan):
            log.info("recipe %s: stage %s not accepted for %d of %d inputs", entry.name, stage, len(still),
                     len(pending))
        pending = still
    if not any(answers):
        status = last.status if last is not None else 504 if loop.time() >= deadline else 503
        # The last failure's own status, Retry-After and, for a refused input, the worker's words and field.
        raise ModelUnavailable(f"recipe {entry.name!r}, decision {choice.decision.name!r}: no stage answered: "
                               + "; ".join(failures or ["no stage to call"]), status,
                               retry_after_s=last.retry_after_s if last else None,
                               refusal=last.refusal if last else None, param=last.param if last else None)
    # 3. The judge, for the inputs no stage was confident on.
    verdicts: dict[int, tuple[int | None, str | None]] = {}
    unsure = [i for i in range(n) if not answers[i][-1].accepted]
    left = deadline - loop.time()
    if unsure and algorithm.judge is not None and judge is not None and left > 0:
        timeout_s = min(algorithm.judge.timeout_s, left)
        # At most the judge's max_calls per request, for the first inputs in order: a batch of unsure
        # inputs must not become as many LLM calls; the rest keep their last stage's answer.
        unsure = unsure[:algorithm.judge.max_calls]
        asked = [_ask(judge, algorithm.judge, _messages(inp, i, answers[i]), len(answers[i]), timeout_s)
                 for i in unsure]
        verdicts = dict(zip(unsure, await asyncio.gather(*asked), strict=True))
    items = tuple(_item(answers[i], verdicts.get(i, (None, None)), i in verdicts) for i in range(n))
    return RecipeResult(items, tuple(called), calls, len(verdicts), tokens, budget.deadline_s, budget.max_calls,
                        choice.decision.name)


def signal_calls(entry: EntryConfig, evaluated: Iterable[str]) -> int:
    """The model calls the evaluated signals made: one per deployment they used (ModelSignals calls
    each deployment once per request); the in-process embedder is no call."""
    by_name = {s.name: s for s in entry.signals}
    return len({s.deployment for name in evaluated if isinstance(s := by_name.get(name), MODEL_SIGNAL_TYPES)
                and not uses_local_embedder(s) and s.deployment is not None})


def tightened(budget: Budget, entry: EntryConfig, decision: str | None) -> Budget:
    """The entry's budget tightened by the chosen decision's own (each value the smaller): a decision
    may only tighten, never loosen. `decision`: the rule's name; None: the default, which has no budget."""
    own = next((rule.budget for rule in entry.decisions if rule.name == decision), None) if decision else None
    if own is None:
        return budget
    return Budget(min(budget.deadline_s, own.deadline_s), min(budget.max_calls, own.max_calls))


async def _stage_call(models: DecisionModels, stage: str, inp: NativeInput, pending: list[int],
                      timeout_s: float) -> tuple[list[Label | tuple[float, ...]], int]:
    """One stage's outputs for the `pending` inputs, in their order, and its prompt tokens; every
    failure a ModelUnavailable that says why (an answer of the wrong shape: 502). An input is never
    cut: a text past a stage's context is that worker's refusal (400), as for the model called alone."""
    try:
        if inp.family == "classifier":
            classified = await models.classify(stage, [inp.texts[i] for i in pending], timeout_s=timeout_s,
                                               truncate=False)
            if len(classified.results) != len(pending):
                raise ModelUnavailable(f"{classified.worker} answered {len(classified.results)} results for "
                                       f"{len(pending)} texts", 502)
            return list(classified.results), classified.prompt_tokens
        reranked = await models.rerank(stage, inp.query, list(inp.documents), timeout_s=timeout_s, truncate=False)
    except KeyError:
        raise ModelUnavailable(f"deployment {stage!r} is not in the model runtime", 503) from None
    scores = tuple(float(s) for s in reranked.scores)
    if len(scores) != len(inp.documents) or not all(map(math.isfinite, scores)):
        raise ModelUnavailable(f"{reranked.worker} answered {len(scores)} scores for {len(inp.documents)} "
                               "documents, or not all finite", 502)
    return [scores], reranked.prompt_tokens


def _messages(inp: NativeInput, i: int, answers: list[StageOutput]) -> list[dict[str, Any]]:
    if inp.family == "classifier":
        asked = judging.cut(inp.texts[i], judging.INPUT_CHARS)
    else:
        listed = "\n".join(f"#{k} {judging.cut(d, DOCUMENT_CHARS)}" for k, d in enumerate(inp.documents, 1))
        asked = judging.cut(f"Query: {inp.query}\nDocuments:\n{listed}", judging.INPUT_CHARS)
    return judging.prompt(inp.family, asked, [(a.stage, judging.option(a.output, inp.documents)) for a in answers])


async def _ask(judge: JudgeCaller, config: JudgeConfig, messages: list[dict[str, Any]], n: int,
               timeout_s: float) -> tuple[int | None, str | None]:
    """(the option the judge chose, None), or (None, why it abstained)."""
    try:
        async with asyncio.timeout(timeout_s):
            reply = await judge.ask(config.pool, messages, timeout_s=timeout_s)
    except TimeoutError:
        return None, f"the judge ({config.pool}) did not reply within {timeout_s:.3g} s"
    except Exception as exc:  # whatever the judge's pool did, the request keeps its stages' answers
        log.warning("judge %s failed: %s: %s", config.pool, type(exc).__name__, exc)
        return None, f"the judge ({config.pool}) failed: {type(exc).__name__}: {exc}"
    chosen = judging.read(reply, n)
    return (chosen, None) if chosen is not None else (None, f"the judge replied {judging.cut(reply, 100)!r}")


def _item(answers: list[StageOutput], judged: tuple[int | None, str | None], asked: bool) -> ItemResult:
    """What the client gets for one input: the accepted answer (the last: it ended the escalation), the
    judge's pick, or the last stage's answer."""
    chosen, why = judged
    if answers[-1].accepted or not asked:
        return ItemResult(answers[-1], tuple(answers), None)
    if chosen is not None:
        return ItemResult(answers[chosen], tuple(answers), "chose")
    return ItemResult(answers[-1], tuple(answers), "abstained", why)
