"""Choose an entry's decision from its signal and projection results: the first rule whose `when` is
true, else the default. Runs in the router process, once per request, after the signals. Pure, no I/O.

Expressions are three-valued: a signal that is unknown (its model failed or ran past the budget), or
not evaluated yet, is neither true nor false. `not` of unknown is unknown; `any` is true when one
item is true, `all` false when one item is false, and unknown otherwise when an item is unknown. A rule
whose `when` is unknown does not hold: the next rule is tried, as when it is false.

A request may also need an output that only some pools produce (an image, or text): the rules whose
candidates do not all produce it are passed over whatever their `when`, and so is the default.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.router.config import AllOf, AnyOf, EntryConfig, Expr, Not, ProjectionRef, SignalRef, references
from services.router.decision.projections import ProjectionResult, project_all
from services.router.decision.signals import SignalResult


class NoEligibleDecision(LookupError):
    """Neither a rule nor the default of the entry has candidates that all produce what the request needs."""


def _every(pools: tuple[str, ...]) -> bool:
    return True


@dataclass(slots=True, frozen=True)
class Decision:
    name: str  # the rule's name, or "default"
    pools: tuple[str, ...]  # candidate pools, in order
    matched_default: bool
    unknown: tuple[str, ...] = ()  # rules passed over because their `when` was unknown


def decide(entry: EntryConfig, results: Mapping[str, SignalResult],
           projections: Mapping[str, ProjectionResult] | None = None, *,
           eligible: Callable[[tuple[str, ...]], bool] = _every) -> Decision:
    """The first of `entry.decisions` (in config order) whose candidates are `eligible` and whose
    condition is true; else the default pools, if eligible; else NoEligibleDecision."""
    passed: list[str] = []
    for rule in entry.decisions:
        if not eligible(rule.pools):
            continue
        value = holds(rule.when, results, projections)
        if value:
            return Decision(rule.name, rule.pools, False, tuple(passed))
        if value is None:
            passed.append(rule.name)
    if not eligible(entry.default):
        raise NoEligibleDecision(entry.name)
    return Decision("default", entry.default, True, tuple(passed))


def holds(expr: Expr, results: Mapping[str, SignalResult],
          projections: Mapping[str, ProjectionResult] | None = None) -> bool | None:
    """True, False, or None (unknown): a signal name stands for that signal having matched, a projection
    reference for its sum falling in one of the bands named. Missing results count as unknown."""
    if isinstance(expr, SignalRef):
        result = results.get(expr.name)
        return None if result is None or result.unknown else result.matched
    if isinstance(expr, ProjectionRef):
        projected = (projections or {}).get(expr.projection)
        return None if projected is None else projected.band in expr.bands
    if isinstance(expr, Not):
        value = holds(expr.item, results, projections)
        return None if value is None else not value
    if isinstance(expr, (AnyOf, AllOf)):
        # any: a true item decides; all: a false one does. Otherwise unknown if an item is.
        decisive = isinstance(expr, AnyOf)
        values = [holds(item, results, projections) for item in expr.items]
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    raise TypeError(f"not a decision expression: {expr!r}")


def models_needed(entry: EntryConfig, results: Mapping[str, SignalResult], *,
                  eligible: Callable[[tuple[str, ...]], bool] = _every) -> tuple[list[str], str | None]:
    """Which model signals the request needs, given its rule signal `results`: those of the `eligible`
    rules, in order, whose `when` the rule signals leave unknown, up to the first rule they make true
    (whose name is returned too: the later rules can no longer be chosen). A rule they make false, or
    one passed over as not eligible, needs nothing."""
    projections = {p.name: p for p in entry.projections}
    partial = project_all(entry.projections, results)
    wanted: set[str] = set()
    for rule in entry.decisions:
        if not eligible(rule.pools):
            continue
        value = holds(rule.when, results, partial)
        if value:
            return [s.name for s in entry.signals if s.name in wanted], rule.name
        if value is None:
            for ref in references(rule.when):
                names = [ref.name] if isinstance(ref, SignalRef) else [
                    i.signal for i in projections[ref.projection].inputs]
                wanted.update(name for name in names if name not in results)
    return [s.name for s in entry.signals if s.name in wanted], None
