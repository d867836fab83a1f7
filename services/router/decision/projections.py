"""Projections (router process, once per request; pure): numbers derived from an entry's signal results,
each the weighted sum of its inputs, and the named band that sum falls in. Decisions test the band.

An input counts 1 or 0 (`value: matched`) or the signal's score (`value: score`); an unknown signal
(its model failed or ran past the budget) counts as the input's `unknown` value, 0 unless set."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.router.config import Projection
from services.router.decision.signals import SignalResult


@dataclass(slots=True, frozen=True)
class ProjectionResult:
    sum: float
    band: str | None  # None only when the sum is below the first band's min
    terms: dict[str, float]  # signal -> weight * value, in input order
    unknown: tuple[str, ...]  # inputs whose signal was unknown, counted as their `unknown` value


def project(projection: Projection, results: Mapping[str, SignalResult]) -> ProjectionResult | None:
    """The projection over `results`; None while one of its signals has no result yet."""
    if any(i.signal not in results for i in projection.inputs):
        return None
    terms: dict[str, float] = {}
    unknown: list[str] = []
    for item in projection.inputs:
        result = results[item.signal]
        if result.unknown:
            value = item.unknown
            unknown.append(item.signal)
        elif item.value == "score":
            value = result.score if result.score is not None else 0.0
        else:
            value = 1.0 if result.matched else 0.0
        terms[item.signal] = terms.get(item.signal, 0.0) + item.weight * value
    total = sum(terms.values())
    return ProjectionResult(total, band_of(projection, total), terms, tuple(unknown))


def band_of(projection: Projection, total: float) -> str | None:
    """The last band whose min the sum reaches (bands ascend; the first one's min may be left out)."""
    found = None
    for band in projection.bands:
        if band.min is not None and total < band.min:
            break
        found = band.name
    return found


def project_all(projections: tuple[Projection, ...], results: Mapping[str, SignalResult]
                ) -> dict[str, ProjectionResult]:
    """Every projection whose signals all have results, by name."""
    done = {p.name: project(p, results) for p in projections}
    return {name: result for name, result in done.items() if result is not None}
