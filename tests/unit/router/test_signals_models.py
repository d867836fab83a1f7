"""Signals answered by deployments (decision/model_signals.py) against a fake of the runtime's port:
what each kind scores and matches, one call per deployment and kind, all in flight at once, and every
way a call can go wrong ending as an unknown signal with its reason, never as a failed request."""
from __future__ import annotations

import asyncio
import logging

import pytest

from services.router.config import ClassifierSignal, DomainSignal, EmbeddingSignal, ModelSignal, RerankSignal
from services.router.decision.model_signals import ModelSignals
from services.router.decision.signals import SignalResult
from services.router.runtime.models import Embedded
from tests.support.fake_models import FakeModels, failing, label, never

CODE = ClassifierSignal("code", "intent", ("code", "debug"), 0.6)
TOPIC = DomainSignal("topic", ("math", "physics"), 0.5, "intent")


def _run(models: FakeModels | None, signals: list[ModelSignal], text: str = "q",
         budget_s: float = 5.0) -> dict[str, SignalResult]:
    return asyncio.run(ModelSignals(models).evaluate(signals, text, budget_s))


# classifier

@pytest.mark.parametrize("top, probs, matched, score, detail", [
    ("code", {"code": 0.9, "chat": 0.1}, True, 0.9, "top label 'code' (p=0.90) in [code, debug], >= 0.60"),
    ("code", {"code": 0.5, "chat": 0.3, "debug": 0.2}, False, 0.5,
     "top label 'code' (p=0.50) in [code, debug], < 0.60"),
    # Not matched: the score is still the best probability among the signal's labels.
    ("chat", {"chat": 0.7, "code": 0.1, "debug": 0.2}, False, 0.2,
     "top label 'chat' (p=0.70) not in [code, debug]"),
], ids=["matched", "below threshold", "other label"])
def test_classifier(top: str, probs: dict[str, float], matched: bool, score: float, detail: str) -> None:
    result = _run(FakeModels(labels={"intent": label(top, probs)}), [CODE])["code"]
    assert result == SignalResult("classifier", matched, detail, score, "http://intent", 0.02, label=top)


# domain

def test_domain_by_classifier() -> None:
    models = FakeModels(labels={"intent": label("math", {"math": 0.8, "law": 0.2})})
    assert _run(models, [TOPIC])["topic"] == SignalResult(
        "domain", True, "domain 'math' (p=0.80) >= 0.50", 0.8, "http://intent", 0.02, label="math")
    models.labels["intent"] = label("law", {"math": 0.3, "law": 0.7})
    law = _run(models, [TOPIC])["topic"]
    assert (law.matched, law.label, law.detail) == (False, "law", "domain 'law' (p=0.70) not in [math, physics]")


def test_a_classifier_and_a_domain_on_one_deployment_share_one_call() -> None:
    models = FakeModels(labels={"intent": label("code", {"code": 0.9, "math": 0.1})})
    results = _run(models, [CODE, TOPIC])
    assert results["code"].matched and not results["topic"].matched
    assert models.calls == [("classify", "intent", ["q"])]


EXAMPLES = (("math", ("integrals", "algebra")), ("cooking", ("recipes",)))
VECTORS = {"integrals": [1.0, 0.0], "algebra": [0.8, 0.6], "recipes": [0.0, 1.0],
           "solve x^2": [0.6, 0.8], "pancakes": [0.1, 0.9]}


def test_domain_by_examples_through_an_embed_deployment() -> None:
    signal = DomainSignal("topic", ("math",), 0.9, "minilm", EXAMPLES)
    models = FakeModels(vectors=VECTORS)
    math = _run(models, [signal], "solve x^2")["topic"]
    assert math == SignalResult("domain", True, "domain 'math' (similarity 0.96 to 'algebra') >= 0.90",
                                pytest.approx(0.96), "http://minilm", 0.01, label="math")
    cooking = _run(models, [signal], "pancakes")["topic"]
    assert (cooking.matched, cooking.label) == (False, "cooking")


def test_examples_are_embedded_once_per_deployment_and_kept() -> None:
    signals: list[ModelSignal] = [EmbeddingSignal("algebra", ("integrals", "algebra"), 0.9, "minilm"),
                                  DomainSignal("topic", ("math",), 0.5, "minilm", EXAMPLES)]
    models = FakeModels(vectors=VECTORS)
    engine = ModelSignals(models)
    for text in ("solve x^2", "pancakes"):
        results = asyncio.run(engine.evaluate(signals, text, 5.0))
        assert not any(r.unknown for r in results.values())
    embedded = [texts for kind, _, texts in models.calls]
    assert embedded.count(["integrals", "algebra"]) == 1
    assert embedded.count(["integrals", "algebra", "recipes"]) == 1
    assert embedded.count(["solve x^2"]) == embedded.count(["pancakes"]) == 1  # the text: once per request


def test_warm_embeds_the_examples_before_the_first_request() -> None:
    signal = EmbeddingSignal("algebra", ("integrals", "algebra"), 0.9, "minilm")
    models = FakeModels(vectors=VECTORS)
    engine = ModelSignals(models)

    async def go() -> dict[str, SignalResult]:
        assert await engine.warm([signal]) == []
        models.calls.clear()
        return await engine.evaluate([signal], "solve x^2", 5.0)

    assert asyncio.run(go())["algebra"].matched
    assert models.calls == [("embed", "minilm", ["solve x^2"])]


# embedding and rerank

def test_embedding_through_a_deployment() -> None:
    signal = EmbeddingSignal("algebra", ("integrals", "algebra"), 0.9, "minilm")
    result = _run(FakeModels(vectors=VECTORS), [signal], "solve x^2")["algebra"]
    assert result == SignalResult("embedding", True, "similarity 0.96 to 'algebra' >= 0.90", pytest.approx(0.96),
                                  "http://minilm", 0.01)


def test_rerank_signals_on_one_deployment_share_one_call() -> None:
    near = RerankSignal("near", "xenc", ("refund policy", "shipping times"), 0.5)
    far = RerankSignal("far", "xenc", ("shipping times", "weather"), 0.5)
    models = FakeModels(relevance={"refund policy": 0.9, "shipping times": 0.2, "weather": 0.1})
    results = _run(models, [near, far])
    assert results["near"] == SignalResult("rerank", True, "relevance 0.90 to 'refund policy' >= 0.50", 0.9,
                                           "http://xenc", 0.03)
    assert (results["far"].matched, results["far"].score) == (False, 0.2)
    assert models.calls == [("rerank", "xenc", ["refund policy", "shipping times", "weather"])]


# concurrency, budget and failures

def test_calls_to_two_deployments_are_in_flight_together() -> None:
    """Each call answers only once both have started: run one after the other, the first would wait
    forever (and both signals end unknown at the budget)."""
    started: set[str] = set()
    both = asyncio.Event()

    async def barrier(kind: str, deployment: str) -> None:
        started.add(deployment)
        if len(started) == 2:
            both.set()
        await both.wait()

    models = FakeModels(labels={"intent": label("code", {"code": 1.0}), "topics": label("math", {"math": 1.0})},
                        hook=barrier)
    results = _run(models, [CODE, DomainSignal("topic", ("math",), 0.5, "topics")], budget_s=5)
    assert results["code"].matched and results["topic"].matched


def test_a_worker_that_never_answers_is_unknown_at_the_budget_and_its_call_cancelled() -> None:
    models = FakeModels(labels={"intent": label("code", {"code": 1.0})}, hook=never)
    result = _run(models, [CODE], budget_s=0.05)["code"]
    assert result.unknown and not result.matched and result.worker is None
    assert result.reason == "no answer within the signal budget (0.05 s)"
    assert result.detail == "unknown: no answer within the signal budget (0.05 s)"
    assert models.cancelled == ["intent"]


def test_a_slow_deployment_does_not_hold_back_a_fast_one() -> None:
    async def slow_topics(kind: str, deployment: str) -> None:
        if deployment == "topics":
            await asyncio.Event().wait()

    models = FakeModels(labels={"intent": label("code", {"code": 1.0})}, hook=slow_topics)
    results = _run(models, [CODE, DomainSignal("topic", ("math",), 0.5, "topics")], budget_s=0.05)
    assert results["code"].matched and results["topic"].unknown


def test_a_failing_worker_makes_the_signal_unknown_with_its_reason() -> None:
    models = FakeModels(hook=failing("deployment 'intent': every worker full (32 in flight)"))
    result = _run(models, [CODE])["code"]
    assert result.unknown and result.reason == "deployment 'intent': every worker full (32 in flight)"


def test_an_unexpected_error_is_logged_and_the_signal_unknown(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(kind: str, deployment: str) -> None:
        raise ValueError("bad json")

    with caplog.at_level(logging.ERROR, "router.signals"):
        result = _run(FakeModels(hook=broken), [CODE])["code"]
    assert result.unknown and result.reason == "deployment 'intent': ValueError: bad json"
    assert [r.message for r in caplog.records] == ["deployment 'intent': the call failed"]


def test_a_malformed_answer_is_unknown() -> None:
    class TwoVectors(FakeModels):
        async def embed(self, deployment: str, texts: list[str], *, timeout_s: float,
                        truncate: bool = True) -> Embedded:
            return Embedded("http://w", 0.0, [[1.0, 0.0]] * (len(texts) + 1))

    signal = EmbeddingSignal("algebra", ("integrals",), 0.9, "minilm")
    result = _run(TwoVectors(), [signal])["algebra"]
    assert result.unknown and "expected 1 finite ones" in (result.reason or "")


def test_failed_examples_are_embedded_again_on_the_next_request() -> None:
    models = FakeModels(vectors=VECTORS)

    async def first_fails(kind: str, deployment: str) -> None:
        if [texts for _, _, texts in models.calls].count(["integrals", "algebra"]) == 1 and \
                models.calls[-1][2] == ["integrals", "algebra"]:
            raise TimeoutError

    models.hook = first_fails
    signal = EmbeddingSignal("algebra", ("integrals", "algebra"), 0.9, "minilm")
    engine = ModelSignals(models)
    first = asyncio.run(engine.evaluate([signal], "solve x^2", 5.0))["algebra"]
    assert first.unknown and first.reason == "embedding the examples: deployment 'minilm': timed out"
    assert asyncio.run(engine.evaluate([signal], "solve x^2", 5.0))["algebra"].matched


def test_without_a_model_runtime_a_deployment_signal_is_unknown() -> None:
    assert _run(None, [CODE])["code"].reason == "no model runtime serves deployment 'intent'"
