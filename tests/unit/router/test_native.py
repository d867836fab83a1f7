"""A native System One recipe run for one request (services/router/decision/native.py): its stages called
in order under one budget, each input escalated alone, the judge asked for the inputs no stage was
confident on, with fakes at the ports (the model runtime's DecisionModels, the JudgeCaller) under the
real decision engine."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from services.router.config import (
    Budget,
    ClassifierSignal,
    ConfidenceAccept,
    DecisionRule,
    EntryConfig,
    JudgeConfig,
    KeywordSignal,
    NativeEscalateAlgorithm,
    RouterConfig,
    SignalRef,
    parse_config,
)
from services.router.decision.engine import Router
from services.router.decision.native import NativeInput, RecipeResult, StageOutput, run
from services.router.runtime.models import Classified, Embedded, Label, ModelUnavailable, Reranked

CONFIDENT = Label("ham", 0.9, {"ham": 0.9, "spam": 0.1})
UNSURE = Label("spam", 0.55, {"ham": 0.45, "spam": 0.55})
UNSURE_HAM = Label("ham", 0.6, {"ham": 0.6, "spam": 0.4})
CODE = Label("code", 0.95, {"code": 0.95, "chat": 0.05})
Hook = Callable[[str], Awaitable[None]]  # (deployment): awaited inside its call before it answers


@dataclass
class Models:
    """DecisionModels with scripted answers: `labels[deployment][text]` (a classifier), or
    `scores[deployment]` (a cross-encoder, for any query); `hooks[deployment]` run inside its calls."""

    labels: dict[str, dict[str, Label]] = field(default_factory=dict)
    scores: dict[str, tuple[float, ...]] = field(default_factory=dict)
    hooks: dict[str, Hook] = field(default_factory=dict)
    calls: list[tuple[str, list[str]]] = field(default_factory=list)  # (deployment, texts or documents)
    cancelled: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)  # each classify or rerank call's `truncate`

    async def embed(self, deployment: str, texts: list[str], *, timeout_s: float, truncate: bool = True) -> Embedded:
        raise AssertionError("a recipe embeds nothing")

    async def classify(self, deployment: str, texts: list[str], *, timeout_s: float,
                       truncate: bool = True) -> Classified:
        self.truncated.append(truncate)
        await self._enter(deployment, texts)
        return Classified(f"http://{deployment}", 0.01, [self.labels[deployment][t] for t in texts],
                          prompt_tokens=10 * len(texts))

    async def rerank(self, deployment: str, query: str, documents: list[str], *, timeout_s: float,
                     truncate: bool = True) -> Reranked:
        self.truncated.append(truncate)
        await self._enter(deployment, documents)
        return Reranked(f"http://{deployment}", 0.01, list(self.scores[deployment]), prompt_tokens=7)

    async def _enter(self, deployment: str, texts: list[str]) -> None:
        self.calls.append((deployment, list(texts)))
        hook = self.hooks.get(deployment)
        try:
            if hook is not None:
                await hook(deployment)
        except asyncio.CancelledError:
            self.cancelled.append(deployment)
            raise


async def _never(deployment: str) -> None:
    await asyncio.Event().wait()


def _failing(status: int) -> Hook:
    async def fail(deployment: str) -> None:
        raise ModelUnavailable(f"deployment {deployment!r}: no worker ready", status)
    return fail


@dataclass
class Judge:
    """A JudgeCaller that replies `reply` (or raises `error`), keeping every question it was asked."""

    reply: str = "1"
    error: Exception | None = None
    asked: list[tuple[str, list[dict[str, Any]], float]] = field(default_factory=list)

    async def ask(self, pool: str, messages: list[dict[str, Any]], *, timeout_s: float) -> str:
        self.asked.append((pool, messages, timeout_s))
        if self.error is not None:
            raise self.error
        return self.reply


ACCEPT = ConfidenceAccept(min_probability=0.8, min_margin=0.2)
STAGES = ("fast", "mid", "strong")
BUDGET = Budget(deadline_s=10, max_calls=3)
CHAT = Label("chat", 0.9, {"chat": 0.9, "code": 0.1})


def _entry(name: str = "spam", *, judge: bool = True, budget: Budget = BUDGET,
           **extra: Any) -> EntryConfig:
    fields: dict[str, Any] = {
        "signals": (KeywordSignal("urgent", ("urgent",)),
                    ClassifierSignal("topic", "guard", ("code",), threshold=0.5)),
        "decisions": (DecisionRule("hurry", SignalRef("urgent"), ("fast", "strong"),
                                   budget=Budget(deadline_s=60, max_calls=1)),
                      DecisionRule("coding", SignalRef("topic"), ("mid", "strong"))),
        "algorithm": NativeEscalateAlgorithm(ACCEPT, JudgeConfig("judge", 5.0) if judge else None),
        **extra}
    return EntryConfig(name, STAGES, api="systemone", budget=budget, **fields)


def _config(*entries: EntryConfig) -> RouterConfig:
    base = parse_config({"listeners": [{"port": 8080}], "pools": {"judge": {"model": "j", "replicas": [
        {"url": "http://judge:8000"}]}}, "entries": {"chat": {"default": ["judge"]}}})
    return replace(base, entries={**base.entries, **{e.name: e for e in entries}})


def _classify(entry: EntryConfig, models: Models, texts: list[str], judge: Judge | None = None) -> RecipeResult:
    router = Router(_config(entry), models=models)
    inp = NativeInput("classifier", texts=tuple(texts))
    # Bounded, so that a budget that is not kept fails the test rather than hanging it.
    return asyncio.run(asyncio.wait_for(run(entry, inp, router=router, models=models, judge=judge), 10))


def _chosen(result: RecipeResult) -> list[tuple[str, Label | tuple[float, ...]]]:
    return [(item.chosen.stage, item.chosen.output) for item in result.items]


def _every_chosen_is_a_stage_answer(result: RecipeResult) -> None:
    for item in result.items:
        assert any(item.chosen is answer for answer in item.answers)


def _guard(label: Label = CHAT) -> dict[str, dict[str, Label]]:
    """The topic signal's classifier: every request text is chat unless said otherwise."""
    return {"guard": _Any(label)}


class _Any(dict[str, Label]):
    """One label for every text."""

    def __init__(self, label: Label) -> None:
        super().__init__()
        self.label = label

    def __missing__(self, key: str) -> Label:
        return self.label


def test_every_input_accepted_by_the_first_stage_is_one_stage_call() -> None:
    models = Models(labels={**_guard(), "fast": {"a": CONFIDENT, "b": CONFIDENT}})
    judge = Judge()
    result = _classify(_entry(), models, ["a", "b"], judge)
    assert _chosen(result) == [("fast", CONFIDENT), ("fast", CONFIDENT)]
    assert [(i.judge, len(i.answers)) for i in result.items] == [(None, 1), (None, 1)]
    assert result.items[0].chosen == StageOutput("fast", CONFIDENT, True, None)
    assert models.calls == [("guard", ["a\nb"]), ("fast", ["a", "b"])]  # the signal sees the texts joined
    assert result.stages_called == ("fast",) and result.calls == 2 and result.judge_calls == 0
    assert result.prompt_tokens == 20 and result.decision == "default"
    assert (result.deadline_s, result.max_calls) == (10, 3) and judge.asked == []


def test_only_the_unaccepted_inputs_go_to_the_next_stage() -> None:
    models = Models(labels={**_guard(), "fast": {"a": CONFIDENT, "b": UNSURE, "c": CONFIDENT},
                            "mid": {"b": CONFIDENT}})
    result = _classify(_entry(), models, ["a", "b", "c"])
    assert models.calls[1:] == [("fast", ["a", "b", "c"]), ("mid", ["b"])]
    assert _chosen(result) == [("fast", CONFIDENT), ("mid", CONFIDENT), ("fast", CONFIDENT)]
    b = result.items[1]
    assert [(a.stage, a.accepted) for a in b.answers] == [("fast", False), ("mid", True)] and b.judge is None
    assert b.answers[0].reason == "top probability 0.55 < min_probability 0.8"
    assert result.stages_called == ("fast", "mid") and result.prompt_tokens == 40


def test_the_call_cap_counts_the_signal_calls_and_cuts_the_third_stage() -> None:
    models = Models(labels={**_guard(), **{s: {"a": UNSURE} for s in STAGES}})
    result = _classify(_entry(judge=False), models, ["a"])
    assert result.stages_called == ("fast", "mid") and result.calls == 3  # the guard signal's call is one
    assert [d for d, _ in models.calls] == ["guard", "fast", "mid"]
    item = result.items[0]
    assert item.chosen.stage == "mid" and item.judge is None  # no judge: the last stage's answer
    _every_chosen_is_a_stage_answer(result)


def test_without_model_signals_the_whole_cap_is_the_stages() -> None:
    entry = _entry(judge=False, signals=(KeywordSignal("urgent", ("urgent",)),),
                   decisions=(DecisionRule("hurry", SignalRef("urgent"), ("fast", "strong")),))
    models = Models(labels={s: {"a": UNSURE} for s in STAGES})
    result = _classify(entry, models, ["a"])
    assert result.stages_called == STAGES and result.calls == 3


def test_the_deadline_cancels_a_slow_stage_and_keeps_the_answers_got() -> None:
    models = Models(labels={**_guard(), "fast": {"a": UNSURE}, "strong": {"a": CONFIDENT}}, hooks={"mid": _never})
    entry = _entry(judge=False, budget=Budget(deadline_s=0.3, max_calls=5))
    result = _classify(entry, models, ["a"])
    assert models.cancelled == ["mid"] and [d for d, _ in models.calls] == ["guard", "fast", "mid"]
    assert result.stages_called == ("fast", "mid") and result.calls == 3  # the cancelled call counts
    assert _chosen(result) == [("fast", UNSURE)]


def test_the_signals_wait_no_longer_than_the_deadline() -> None:
    # The entry's signal budget (30 s) is longer than the test's bound: only the deadline can end the wait.
    models = Models(labels={"fast": {"a": CONFIDENT}}, hooks={"guard": _never})
    entry = _entry(budget=Budget(deadline_s=0.2, max_calls=3), signal_budget_s=30.0)
    with pytest.raises(ModelUnavailable) as caught:
        _classify(entry, models, ["a"])
    assert caught.value.status == 504 and "stage 'fast' not called: the deadline (0.2 s) passed" in str(caught.value)
    assert models.cancelled == ["guard"]


def test_the_judge_chooses_among_an_inputs_answers() -> None:
    models = Models(labels={**_guard(), "fast": {"a": UNSURE, "b": UNSURE_HAM, "c": CONFIDENT},
                            "mid": {"a": UNSURE_HAM, "b": UNSURE}, "strong": {"a": UNSURE, "b": UNSURE}})
    judge = Judge(reply="2")
    entry = _entry(budget=Budget(deadline_s=10, max_calls=4))
    result = _classify(entry, models, ["a", "b", "c"], judge)
    assert [(i.chosen.stage, i.judge) for i in result.items] == [("mid", "chose"), ("mid", "chose"), ("fast", None)]
    assert result.items[0].chosen.output == UNSURE_HAM and result.items[0].chosen.accepted is False
    assert result.judge_calls == 2 and result.calls == 4  # judge calls are not model calls
    pool, messages, timeout_s = judge.asked[0]
    assert pool == "judge" and 0 < timeout_s <= 5.0
    user = messages[1]["content"]
    assert user.startswith("Input:\na\n") and "Option 1 (from fast):\nlabel spam (probability 0.550)" in user
    assert "Option 3 (from strong)" in user
    _every_chosen_is_a_stage_answer(result)


@pytest.mark.parametrize(("reply", "error", "detail"), [
    ("abstain", None, "the judge replied 'abstain'"),
    ("I'd say 1", None, "the judge replied \"I'd say 1\""),
    ("7", None, "the judge replied '7'"),
    ("", RuntimeError("pool down"), "the judge (judge) failed: RuntimeError: pool down"),
])
def test_a_judge_that_abstains_garbles_or_fails_leaves_the_last_stages_answer(
        reply: str, error: Exception | None, detail: str) -> None:
    models = Models(labels={**_guard(), "fast": {"a": UNSURE}, "mid": {"a": UNSURE_HAM}})
    result = _classify(_entry(), models, ["a"], Judge(reply=reply, error=error))
    [item] = result.items
    assert (item.chosen.stage, item.chosen.output, item.judge, item.judge_detail) == ("mid", UNSURE_HAM, "abstained",
                                                                                      detail)
    assert result.judge_calls == 1


def test_a_judge_past_the_deadline_abstains() -> None:
    models = Models(labels={**_guard(), "fast": {"a": UNSURE}, "mid": {"a": UNSURE_HAM}})

    class Slow(Judge):
        async def ask(self, pool: str, messages: list[dict[str, Any]], *, timeout_s: float) -> str:
            await asyncio.Event().wait()  # ignores the timeout it is given: the recipe must not
            return "1"

    result = _classify(_entry(budget=Budget(deadline_s=0.3, max_calls=3)), models, ["a"], Slow())
    assert result.items[0].judge == "abstained" and result.items[0].chosen.stage == "mid"
    assert "did not reply" in (result.items[0].judge_detail or "")


def test_no_judge_caller_means_no_judge() -> None:
    models = Models(labels={**_guard(), "fast": {"a": UNSURE}, "mid": {"a": UNSURE_HAM}})
    result = _classify(_entry(), models, ["a"], None)
    assert result.items[0].judge is None and result.judge_calls == 0


def test_a_failed_stage_passes_its_inputs_to_the_next() -> None:
    models = Models(labels={**_guard(), "mid": {"a": CONFIDENT, "b": CONFIDENT}}, hooks={"fast": _failing(503)})
    result = _classify(_entry(), models, ["a", "b"])
    assert [d for d, _ in models.calls] == ["guard", "fast", "mid"] and models.calls[2][1] == ["a", "b"]
    assert _chosen(result) == [("mid", CONFIDENT), ("mid", CONFIDENT)]
    assert result.stages_called == ("fast", "mid") and result.calls == 3 and result.prompt_tokens == 20


def test_when_no_stage_answers_the_error_names_each_and_has_the_last_status() -> None:
    models = Models(labels=_guard(), hooks={"fast": _failing(503), "mid": _failing(429)})
    with pytest.raises(ModelUnavailable) as caught:
        _classify(_entry(), models, ["a"])
    assert caught.value.status == 429
    message = str(caught.value)
    assert message.startswith("recipe 'spam', decision 'default': no stage answered: ")
    assert "stage 'fast': deployment 'fast': no worker ready" in message
    assert "stage 'mid': deployment 'mid': no worker ready" in message
    assert "stage 'strong' not called: the call cap (3 calls) was reached" in message


def test_an_answer_of_the_wrong_shape_is_that_stages_failure() -> None:
    class Short(Models):
        async def classify(self, deployment: str, texts: list[str], *, timeout_s: float,
                           truncate: bool = True) -> Classified:
            answer = await super().classify(deployment, texts, timeout_s=timeout_s)
            return replace(answer, results=answer.results[:1]) if deployment == "fast" else answer

    models = Short(labels={**_guard(), "fast": {"a": CONFIDENT, "b": CONFIDENT}, "mid": {"a": CONFIDENT, "b": UNSURE}})
    result = _classify(_entry(judge=False), models, ["a", "b"])
    assert result.stages_called == ("fast", "mid") and _chosen(result) == [("mid", CONFIDENT), ("mid", UNSURE)]


def test_a_decisions_budget_tightens_the_entrys_and_never_loosens_it() -> None:
    models = Models(labels={"fast": {"urgent a": UNSURE}, "strong": {"urgent a": CONFIDENT}})
    result = _classify(_entry(judge=False), models, ["urgent a"])
    # hurry: max_calls 1 tightens the entry's 3; its deadline 60 s does not loosen the entry's 10 s.
    assert result.decision == "hurry" and (result.deadline_s, result.max_calls) == (10, 1)
    assert result.stages_called == ("fast",) and [d for d, _ in models.calls] == ["fast"]  # urgent settles it
    assert _chosen(result) == [("fast", UNSURE)]


def test_a_decision_gives_its_own_stages() -> None:
    models = Models(labels={"guard": _Any(CODE), "mid": {"a": UNSURE}, "strong": {"a": CONFIDENT}})
    result = _classify(_entry(), models, ["a"])
    assert result.decision == "coding" and result.stages_called == ("mid", "strong")
    assert _chosen(result) == [("strong", CONFIDENT)] and result.calls == 3


def test_a_cross_encoder_is_one_input_judged_by_its_best_score_and_margin() -> None:
    entry = _entry(signals=(), decisions=())
    models = Models(scores={"fast": (0.85, 0.8, 0.1), "mid": (0.3, 0.9, 0.2)})
    router = Router(_config(entry), models=models)
    inp = NativeInput("cross_encoder", query="what is a cat?", documents=("cats", "a cat is a feline", "dogs"))
    result = asyncio.run(run(entry, inp, router=router, models=models, judge=Judge()))
    [item] = result.items
    assert (item.chosen.stage, item.chosen.output, item.judge) == ("mid", (0.3, 0.9, 0.2), None)
    assert item.answers[0].reason == "margin 0.05 to the runner-up < min_margin 0.2"
    assert models.calls == [("fast", list(inp.documents)), ("mid", list(inp.documents))]
    assert result.calls == 2 and result.prompt_tokens == 14


def test_a_cross_encoders_judge_sees_the_query_and_each_options_best_document() -> None:
    entry = _entry(signals=(), decisions=())
    models = Models(scores={s: (0.5, 0.45) for s in STAGES})
    judge = Judge(reply="1")
    inp = NativeInput("cross_encoder", query="what is a cat?", documents=("cats", "a cat is a feline"))
    result = asyncio.run(run(entry, inp, router=Router(_config(entry), models=models), models=models, judge=judge))
    assert result.items[0].judge == "chose" and result.items[0].chosen.stage == "fast"
    user = judge.asked[0][1][1]["content"]
    assert "Query: what is a cat?\nDocuments:\n#1 cats\n#2 a cat is a feline" in user
    assert "Option 1 (from fast):\nbest document #1 (score 0.500): cats; others by score: #2 0.450" in user
    assert "relevance ranking" in judge.asked[0][1][0]["content"]


def test_nothing_to_answer_is_refused() -> None:
    entry = _entry(signals=(), decisions=())
    models = Models()
    router = Router(_config(entry), models=models)
    for inp in (NativeInput("classifier"), NativeInput("cross_encoder", query="q")):
        with pytest.raises(ModelUnavailable) as caught:
            asyncio.run(run(entry, inp, router=router, models=models, judge=None))
        assert caught.value.status == 400
    assert models.calls == []


def test_choose_caps_the_model_signals_wait_at_the_budget_it_is_given() -> None:
    entry = _entry(signal_budget_s=30.0)
    router = Router(_config(entry), models=Models(hooks={"guard": _never}))
    choice = asyncio.run(asyncio.wait_for(router.choose({"model": "spam"}, "a", signal_budget_s=0.05), 10))
    assert choice.signals["topic"].reason == "no answer within the signal budget (0.05 s)"
    assert choice.plan == STAGES and choice.decision.name == "default"


def test_the_judge_is_asked_for_at_most_its_max_calls_inputs_per_request() -> None:
    texts = [f"t{i}" for i in range(6)]
    entry = _entry(algorithm=NativeEscalateAlgorithm(ACCEPT, JudgeConfig("judge", 5.0, max_calls=2)))
    models = Models(labels={**_guard(), **{s: {t: UNSURE for t in texts} for s in STAGES}})
    judge = Judge(reply="1")
    result = _classify(entry, models, texts, judge)
    assert result.judge_calls == 2 and len(judge.asked) == 2  # not six LLM calls for one request
    assert [i.judge for i in result.items] == ["chose", "chose", None, None, None, None]
    assert [i.chosen.stage for i in result.items] == ["fast", "fast", "mid", "mid", "mid", "mid"]
    _every_chosen_is_a_stage_answer(result)


def test_a_stage_is_never_asked_to_cut_the_input() -> None:
    models = Models(labels={**_guard(), **{s: {"a": UNSURE} for s in STAGES}})
    _classify(_entry(judge=False), models, ["a"])
    assert models.truncated == [True, False, False]  # the guard signal cuts a long prompt; fast and mid never


def _refusing(deployment: str) -> Hook:
    async def refuse(called: str) -> None:
        raise ModelUnavailable(f"http://{called}:1 refused /classify: HTTP 400: too long", 400,
                               refusal="This model's maximum context length is 512 tokens", param="input")
    return refuse


def test_a_refused_input_is_the_clients_400_with_the_workers_words_and_no_later_stage() -> None:
    models = Models(labels={**_guard(), **{s: {"a": UNSURE} for s in STAGES}}, hooks={"fast": _refusing("fast")})
    with pytest.raises(ModelUnavailable) as caught:
        _classify(_entry(judge=False), models, ["a"])
    assert caught.value.status == 400 and caught.value.param == "input"
    assert caught.value.public_message == "This model's maximum context length is 512 tokens"
    assert "http://" not in caught.value.public_message
    assert [d for d, _ in models.calls] == ["guard", "fast"]  # mid is not asked what the client must change


def test_a_refusal_after_an_answer_keeps_the_answer_and_stops() -> None:
    models = Models(labels={**_guard(), **{s: {"a": UNSURE} for s in STAGES}}, hooks={"mid": _refusing("mid")})
    result = _classify(_entry(judge=False, budget=Budget(10, 5)), models, ["a"])
    assert result.stages_called == ("fast", "mid") and result.items[0].chosen.stage == "fast"


def test_every_stage_full_is_a_429_with_retry_after() -> None:
    async def full(deployment: str) -> None:
        raise ModelUnavailable(f"deployment {deployment!r}: every worker full", 429, retry_after_s=1)
    models = Models(labels=_guard(), hooks={s: full for s in STAGES})
    with pytest.raises(ModelUnavailable) as caught:
        _classify(_entry(judge=False), models, ["a"])
    assert caught.value.status == 429 and caught.value.retry_after_s == 1
