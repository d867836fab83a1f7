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
    SignalRef,
    parse_config,
)
from services.router.decision.decisions import Decision, decide, holds
from services.router.decision.signals import SignalResult, evaluate_rules, unknown

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
