from __future__ import annotations

import pytest

from services.router.config import (
    AllOf,
    AnyOf,
    DecisionRule,
    EntryConfig,
    Expr,
    KeywordSignal,
    Not,
    ProjectionRef,
    SignalRef,
    parse_config,
)
from services.router.decision.decisions import Decision, decide, holds, models_needed
from services.router.decision.projections import ProjectionResult
from services.router.decision.signals import SignalResult, evaluate_rules, unknown

ATTACHED = {"urls": ["http://worker:8000"]}  # where a deployment's workers are (no worker is called)

RESULTS = {name: SignalResult("keyword", matched, "") for name, matched in
           (("yes", True), ("also", True), ("no", False), ("nor", False))}
YES, ALSO, NO, NOR = (SignalRef(n) for n in ("yes", "also", "no", "nor"))


@pytest.mark.parametrize("expr, value", [
    (YES, True),
    (NO, False),
    (Not(NO), True),
    (Not(YES), False),
    (AnyOf((NO, NOR)), False),
    (AnyOf((NO, YES)), True),
    (AllOf((YES, ALSO)), True),
    (AllOf((YES, NO)), False),
    (AllOf((YES, Not(AnyOf((NO, NOR))))), True),
    (Not(AllOf((YES, AnyOf((NOR, ALSO))))), False),
])
def test_holds(expr: Expr, value: bool) -> None:
    assert holds(expr, RESULTS) is value


def test_first_matching_rule_wins() -> None:
    entry = EntryConfig("auto", ("small",), decisions=(
        DecisionRule("never", NO, ("x",)),
        DecisionRule("first", YES, ("big", "small")),
        DecisionRule("second", ALSO, ("other",))))
    assert decide(entry, RESULTS) == Decision("first", ("big", "small"), False)


def test_default_when_no_rule_matches() -> None:
    entry = EntryConfig("auto", ("small", "big"), decisions=(DecisionRule("never", AnyOf((NO, NOR)), ("x",)),))
    assert decide(entry, RESULTS) == Decision("default", ("small", "big"), True)
    assert decide(EntryConfig("plain", ("small",)), {}) == Decision("default", ("small",), True)


def test_from_config_through_signals() -> None:
    config = parse_config({
        "listeners": [{"port": 8080}],
        "pools": {name: {"model": name, "replicas": [{"url": f"http://{name}"}]} for name in ("small", "big")},
        "entries": {"auto": {
            "signals": [{"name": "urgent", "type": "keyword", "keywords": ["urgent"]},
                        {"name": "code", "type": "regex", "pattern": "```"},
                        {"name": "long", "type": "context_length", "min_tokens": 100}],
            "decisions": [{"name": "long-code", "when": {"all": ["code", "long"]}, "pools": ["big"]},
                          {"name": "quick", "when": {"all": ["urgent", {"not": "code"}]}, "pools": ["small"]},
                          {"name": "code", "when": {"any": ["code"]}, "pools": ["small", "big"]}],
            "default": ["big"]}}}, env={})
    entry = config.entries["auto"]

    def route(text: str) -> str:
        return decide(entry, evaluate_rules(list(entry.signals), text)).name  # type: ignore[arg-type]

    assert route("urgent: fix this") == "quick"
    assert route("urgent ```x```") == "code"
    assert route("```" + "x" * 400 + "```") == "long-code"
    assert route("hello") == "default"


def test_unknown_expression_is_an_error() -> None:
    with pytest.raises(TypeError, match="not a decision expression"):
        holds(KeywordSignal("k", ("x",)), RESULTS)  # type: ignore[arg-type]


# three-valued: an unknown signal is neither true nor false

RESULTS_U = {**RESULTS, "lost": unknown("classifier", "timed out")}
LOST = SignalRef("lost")


@pytest.mark.parametrize("expr, value", [
    (LOST, None),
    (SignalRef("never evaluated"), None),
    (Not(LOST), None),  # not unknown is unknown: `{not: jailbreak}` does not hold when the guard did not answer
    (AnyOf((LOST, YES)), True),  # one true item decides `any`
    (AnyOf((LOST, NO)), None),
    (AllOf((LOST, NO)), False),  # one false item decides `all`
    (AllOf((LOST, YES)), None),
    (Not(AllOf((LOST, NO))), True),
], ids=["unknown", "missing", "not unknown", "any true", "any unknown", "all false", "all unknown", "not false"])
def test_holds_with_unknown(expr: Expr, value: bool | None) -> None:
    assert holds(expr, RESULTS_U) is value


def test_a_rule_that_is_unknown_is_passed_over_and_reported() -> None:
    entry = EntryConfig("auto", ("small",), decisions=(
        DecisionRule("guarded", Not(LOST), ("x",)),
        DecisionRule("next", YES, ("big",))))
    assert decide(entry, RESULTS_U) == Decision("next", ("big",), False, ("guarded",))


def test_projection_reference() -> None:
    results = {"long": SignalResult("context_length", True, "")}
    ref = ProjectionRef("difficulty", ("medium", "hard"))
    assert holds(ref, results, {"difficulty": ProjectionResult(0.7, "hard", {}, ())}) is True
    assert holds(ref, results, {"difficulty": ProjectionResult(0.1, "easy", {}, ())}) is False
    assert holds(ref, results, {}) is None  # not computed: its signals were not all evaluated


# which model signals a request needs, given its rule signals

def _needs(decisions: list[dict[str, object]], text: str) -> tuple[list[str], str | None]:
    config = parse_config({
        "listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a"}]}},
        "deployments": {"d": {"model": "m", "tasks": ["classify"], "attached": ATTACHED}},
        "entries": {"auto": {
            "signals": [{"name": "urgent", "type": "keyword", "keywords": ["urgent"]},
                        {"name": "a", "type": "classifier", "deployment": "d", "labels": ["x"]},
                        {"name": "b", "type": "classifier", "deployment": "d", "labels": ["y"]},
                        {"name": "c", "type": "classifier", "deployment": "d", "labels": ["z"]}],
            "projections": [{"name": "mix", "inputs": [{"signal": "c", "weight": 1}],
                             "bands": [{"name": "low"}, {"name": "high", "min": 0.5}]}],
            "decisions": [{**d, "pools": ["p"]} for d in decisions], "default": ["p"]}}}, env={})
    entry = config.entries["auto"]
    return models_needed(entry, evaluate_rules([entry.signals[0]], text))  # type: ignore[list-item]


def test_models_needed_stop_at_the_first_rule_the_rule_signals_make_true() -> None:
    decisions = [{"name": "fast", "when": "urgent"}, {"name": "ai", "when": "a"}]
    assert _needs(decisions, "urgent!") == ([], "fast")
    assert _needs(decisions, "hello") == (["a"], None)


def test_models_needed_skip_rules_the_rule_signals_make_false_and_follow_projections() -> None:
    decisions = [{"name": "one", "when": {"all": ["urgent", "a"]}},  # false without `a` when not urgent
                 {"name": "two", "when": {"any": ["urgent", "b"]}},  # true without `b` when urgent
                 {"name": "three", "when": {"projection": "mix", "band": "high"}}]
    assert _needs(decisions, "calm") == (["b", "c"], None)
    assert _needs(decisions, "urgent") == (["a"], "two")
