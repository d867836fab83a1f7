"""Choose an entry's decision from its signal results: the first rule whose `when` holds, else the default.

Runs in the router process, once per request, after signals.evaluate. Pure, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.router.config import AllOf, AnyOf, EntryConfig, Expr, Not, SignalRef
from services.router.decision.signals import SignalResult


@dataclass(slots=True, frozen=True)
class Decision:
    name: str  # the rule's name, or "default"
    pools: tuple[str, ...]  # candidate pools, in order
    matched_default: bool


def decide(entry: EntryConfig, results: Mapping[str, SignalResult]) -> Decision:
    """The first of `entry.decisions` (in config order) whose condition holds; else the default pools."""
    for rule in entry.decisions:
        if holds(rule.when, results):
            return Decision(rule.name, rule.pools, False)
    return Decision("default", entry.default, True)


def holds(expr: Expr, results: Mapping[str, SignalResult]) -> bool:
    """Whether a `when` expression is true; a signal name stands for that signal having matched."""
    if isinstance(expr, SignalRef):
        return results[expr.name].matched
    if isinstance(expr, AnyOf):
        return any(holds(item, results) for item in expr.items)
    if isinstance(expr, AllOf):
        return all(holds(item, results) for item in expr.items)
    if isinstance(expr, Not):
        return not holds(expr.item, results)
    raise TypeError(f"not a decision expression: {expr!r}")
