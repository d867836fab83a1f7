"""The decision engine with model-backed signals (decision/engine.py), the model runtime replaced by a fake
of its port: only the signals a request's decisions need are evaluated, an unknown signal never fails
the request, and the explain route (/v1/router/explain) shows each signal's score, worker, latency, and why
a signal is unknown or was not evaluated. Through the router's ASGI app, as a client sees it."""
from __future__ import annotations

import asyncio
import random
from typing import Any

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Choice, Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import request
from tests.support.fake_models import FakeModels, label, never
from tests.support.fake_upstream import FakeUpstream, Reply, completion

ATTACHED = {"urls": ["http://worker:8000"]}  # where a deployment's workers are (no worker is called)

CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080}],
    "pools": {name: {"model": f"{name}-m", "replicas": [{"url": f"http://{name}"}]} for name in ("small", "big")},
    "deployments": {"intent": {"model": "clf", "tasks": ["classify"], "attached": ATTACHED},
                    "guard": {"model": "guard", "tasks": ["classify"], "attached": ATTACHED},
                    "xenc": {"model": "xenc", "tasks": ["rerank"], "attached": ATTACHED}},
    "entries": {"auto": {
        "signal_budget_s": 0.2,
        "signals": [{"name": "long", "type": "context_length", "min_tokens": 50},
                    {"name": "code", "type": "classifier", "deployment": "intent", "labels": ["code"],
                     "threshold": 0.5},
                    {"name": "unsafe", "type": "classifier", "deployment": "guard", "labels": ["unsafe"]},
                    {"name": "faq", "type": "rerank", "deployment": "xenc", "examples": ["refund policy"]}],
        "projections": [{"name": "difficulty", "inputs": [{"signal": "long", "weight": 0.5},
                                                          {"signal": "code", "weight": 0.5, "value": "score"}],
                         "bands": [{"name": "easy"}, {"name": "hard", "min": 0.4}]}],
        "decisions": [{"name": "long", "when": "long", "pools": ["big"]},
                      {"name": "safe-hard", "when": {"all": [{"not": "unsafe"},
                                                             {"projection": "difficulty", "band": "hard"}]},
                       "pools": ["big"]}],
        "default": ["small"]}},
}


def _models(**hooked: Any) -> FakeModels:
    return FakeModels(labels={"intent": label("code", {"code": 0.9, "chat": 0.1}),
                              "guard": label("safe", {"safe": 0.95, "unsafe": 0.05})},
                      relevance={"refund policy": 0.9}, **hooked)


def _choose(models: FakeModels, text: str) -> Choice:
    router = Router(parse_config(CONFIG), models=models, rng=random.Random(1))
    return asyncio.run(router.choose({"model": "auto", "messages": [{"role": "user", "content": text}]}))


def test_a_signal_no_decision_uses_is_never_called() -> None:
    models = _models()
    choice = _choose(models, "fix my code")
    assert choice.decision.name == "safe-hard"
    assert sorted(kind_deployment[:2] for kind_deployment in models.calls) == [("classify", "guard"),
                                                                              ("classify", "intent")]
    assert "faq" not in choice.signals and choice.skipped == {"faq": "no decision uses it"}


def test_no_model_is_called_when_rule_signals_settle_the_decision() -> None:
    models = _models()
    choice = _choose(models, "word " * 100)
    assert choice.decision.name == "long" and models.calls == []
    assert choice.skipped == {"code": "not needed: decision 'long' held on rule signals",
                              "unsafe": "not needed: decision 'long' held on rule signals",
                              "faq": "no decision uses it"}
    assert list(choice.signals) == ["long"]


def test_an_unanswered_guard_never_fails_the_request_and_its_rule_is_passed_over() -> None:
    async def guard_hangs(kind: str, deployment: str) -> None:
        if deployment == "guard":
            await never(kind, deployment)

    choice = _choose(_models(hook=guard_hangs), "fix my code")
    # `not unsafe` is unknown when the guard did not answer: the rule does not hold, the default does.
    assert (choice.decision.name, choice.decision.unknown) == ("default", ("safe-hard",))
    described = choice.describe()
    assert described["signals"]["unsafe"] == {
        "type": "classifier", "matched": False, "unknown": True, "score": None, "label": None,
        "detail": "unknown: no answer within the signal budget (0.2 s)",
        "reason": "no answer within the signal budget (0.2 s)", "worker": None, "latency_s": None}
    assert described["signals"]["code"] == {
        "type": "classifier", "matched": True, "unknown": False, "score": 0.9, "label": "code",
        "detail": "top label 'code' (p=0.90) in [code], >= 0.50", "reason": None, "worker": "http://intent",
        "latency_s": 0.02}
    assert described["projections"] == {"difficulty": {"sum": 0.45, "band": "hard",
                                                       "terms": {"long": 0.0, "code": 0.45}, "unknown": []}}
    assert described["passed_over"] == ["safe-hard"] and described["signal_budget_s"] == 0.2


def test_explain_and_dispatch_through_the_app() -> None:
    config = parse_config(CONFIG)
    models = _models()
    router = Router(config, models=models, rng=random.Random(1))
    pools = build_pools(config)
    upstream = FakeUpstream()
    metrics = RouterMetrics(pools)
    app = RouterApp(config, router, pools, upstream, metrics)
    body = {"model": "auto", "messages": [{"role": "user", "content": "fix my code"}]}
    explained = asyncio.run(request(app, "POST", "/v1/router/explain", body)).json()
    assert explained["decision"] == "safe-hard" and explained["pool"] == "big"
    assert explained["signals"]["unsafe"]["worker"] == "http://guard"
    assert explained["signals"]["unsafe"]["score"] == 0.05 and not explained["signals"]["unsafe"]["matched"]
    assert explained["skipped"] == {"faq": "no decision uses it"}
    upstream.answer("http://big", Reply(chunks=(completion("ok"),)))
    answered = asyncio.run(request(app, "POST", "/v1/chat/completions", body))
    assert answered.status == 200 and answered.headers["x-router-decision"] == "safe-hard"
    count = metrics.registry.get_sample_value
    assert count("router_signal_results_total", {"entry": "auto", "signal": "code", "result": "matched"}) == 1
    assert count("router_signal_results_total", {"entry": "auto", "signal": "unsafe", "result": "unmatched"}) == 1
    assert count("router_signal_seconds_count", {"entry": "auto"}) == 1  # the explain route counts nothing
