"""Projections (decision/projections.py): the weighted sum of signal values, the band it falls in, and
what an unknown signal counts as; read from the config with errors that name the key."""
from __future__ import annotations

from typing import Any

import pytest

from services.router.config import Band, ConfigError, Projection, ProjectionInput, parse_config
from services.router.decision.projections import ProjectionResult, band_of, project, project_all
from services.router.decision.signals import SignalResult, unknown

ATTACHED = {"urls": ["http://worker:8000"]}  # where a deployment's workers are (no worker is called)

BANDS = (Band("easy"), Band("medium", 0.3), Band("hard", 0.6))
DIFFICULTY = Projection("difficulty", (ProjectionInput("long", 0.4), ProjectionInput("code", 0.5, "score"),
                                       ProjectionInput("simple", -0.3)), BANDS)


def _result(matched: bool, score: float | None = None) -> SignalResult:
    return SignalResult("x", matched, "", score)


def test_matched_counts_one_score_counts_the_score_weights_may_be_negative() -> None:
    results = {"long": _result(True), "code": _result(False, 0.4), "simple": _result(True)}
    assert project(DIFFICULTY, results) == ProjectionResult(
        pytest.approx(0.3), "medium", {"long": 0.4, "code": pytest.approx(0.2), "simple": -0.3}, ())


@pytest.mark.parametrize("total, band", [(-5.0, "easy"), (0.29, "easy"), (0.3, "medium"), (0.59, "medium"),
                                         (0.6, "hard"), (100.0, "hard")])
def test_band_is_the_last_whose_min_the_sum_reaches(total: float, band: str) -> None:
    assert band_of(DIFFICULTY, total) == band


def test_below_a_first_band_with_a_min_is_no_band() -> None:
    projection = Projection("p", DIFFICULTY.inputs, (Band("some", 0.0), Band("more", 1.0)))
    assert band_of(projection, -0.1) is None and band_of(projection, 0.0) == "some"


def test_an_unknown_signal_counts_as_its_unknown_value() -> None:
    cautious = Projection("p", (ProjectionInput("long", 0.4), ProjectionInput("code", 0.5, "score", unknown=1.0)),
                          BANDS)
    results = {"long": _result(False), "code": unknown("classifier", "timed out")}
    assert project(cautious, results) == ProjectionResult(0.5, "medium", {"long": 0.0, "code": 0.5}, ("code",))
    # By default an unknown signal adds nothing: as if it had not matched.
    results = {"long": _result(True), "code": unknown("classifier", "x"), "simple": _result(False)}
    assert project(DIFFICULTY, results) == ProjectionResult(0.4, "medium", {"long": 0.4, "code": 0.0,
                                                                           "simple": 0.0}, ("code",))


def test_a_projection_waits_for_all_its_signals() -> None:
    assert project(DIFFICULTY, {"long": _result(True)}) is None
    assert project_all((DIFFICULTY,), {"long": _result(True)}) == {}


# config

HARD = {"projection": "difficulty", "band": "hard"}


def _config(projections: Any, when: Any = HARD) -> dict[str, Any]:
    return {"listeners": [{"port": 8080}], "pools": {"big": {"model": "m", "replicas": [{"url": "http://a"}]}},
            "deployments": {"intent": {"model": "m", "tasks": ["classify"], "attached": ATTACHED}},
            "entries": {"auto": {
                "signals": [{"name": "long", "type": "context_length", "min_tokens": 100},
                            {"name": "code", "type": "classifier", "deployment": "intent", "labels": ["code"]},
                            {"name": "kw", "type": "keyword", "keywords": ["x"]}],
                "projections": projections,
                "decisions": [{"name": "hard", "when": when, "pools": ["big"]}], "default": ["big"]}}}


GOOD = [{"name": "difficulty", "inputs": [{"signal": "long", "weight": 0.4},
                                         {"signal": "code", "weight": 0.6, "value": "score", "unknown": 1}],
         "bands": [{"name": "easy"}, {"name": "hard", "min": 0.5}]}]


def test_projections_from_the_config() -> None:
    entry = parse_config(_config(GOOD, {"projection": "difficulty", "band": ["easy", "hard"]})).entries["auto"]
    assert entry.projections == (Projection("difficulty", (ProjectionInput("long", 0.4),
                                                           ProjectionInput("code", 0.6, "score", 1.0)),
                                            (Band("easy"), Band("hard", 0.5))),)
    assert entry.needed == {"long", "code"}  # through the projection; kw: no decision uses it


def _errors(projections: Any, when: Any = HARD) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(projections, when))
    return info.value.errors


P = "entries.auto.projections[0]"


@pytest.mark.parametrize("edit, error", [
    (lambda p: p["inputs"][0].update(signal="nope"),
     f"{P}.inputs[0].signal: unknown signal 'nope' (signals: long, code, kw)"),
    (lambda p: p["inputs"][0].update(value="score"),
     f"{P}.inputs[0].value: signal 'long' (context_length) has no score; use value: matched"),
    (lambda p: p["inputs"][0].update(value="prob"),
     f"{P}.inputs[0].value: unknown value 'prob' (values: matched, score)"),
    (lambda p: p["inputs"][0].update(weight=float("inf")), f"{P}.inputs[0].weight: expected a finite number, got inf"),
    (lambda p: p["inputs"][0].pop("weight"), f"{P}.inputs[0].weight: required"),
    (lambda p: p.update(inputs=[]), f"{P}.inputs: expected a non-empty list, got an empty list"),
    (lambda p: p["bands"][1].pop("min"), f"{P}.bands[1].min: required: every band but the first starts at its min"),
    (lambda p: p["bands"].append({"name": "harder", "min": 0.5}),
     f"{P}.bands[2].min: expected more than the previous band's min (0.5), got 0.5"),
    (lambda p: p["bands"].append({"name": "hard", "min": 0.9}), f"{P}.bands[2].name: duplicate band 'hard'"),
], ids=["unknown signal", "score of a rule signal", "unknown value", "infinite weight", "no weight", "no inputs",
        "band without min", "bands not ascending", "duplicate band"])
def test_projection_errors_name_the_key(edit: Any, error: str) -> None:
    projections = [{**GOOD[0], "inputs": [dict(i) for i in GOOD[0]["inputs"]],
                    "bands": [dict(b) for b in GOOD[0]["bands"]]}]
    edit(projections[0])
    assert _errors(projections) == (error,)


@pytest.mark.parametrize("when, error", [
    ({"projection": "nope", "band": "hard"}, "when.projection: unknown projection 'nope' (projections: difficulty)"),
    ({"projection": "difficulty", "band": "extreme"},
     "when.band: unknown band 'extreme' (bands of difficulty: easy, hard)"),
    ({"projection": "difficulty", "band": ["hard", "x"]},
     "when.band[1]: unknown band 'x' (bands of difficulty: easy, hard)"),
    ({"projection": "difficulty"}, "when.band: required"),
    ({"projection": "difficulty", "band": "hard", "min": 1}, "when.min: unknown key; allowed: projection, band"),
], ids=["unknown projection", "unknown band", "unknown band in a list", "no band", "extra key"])
def test_projection_reference_errors(when: Any, error: str) -> None:
    assert _errors(GOOD, when) == ("entries.auto.decisions[0]." + error,)


def test_bands_not_a_list_is_an_error_not_a_crash() -> None:
    """A decision names the broken projection's band: its bands are read as far as they go."""
    broken = [{**GOOD[0], "bands": 5}]
    assert _errors(broken) == (f"{P}.bands: expected a non-empty list, got 5",
                               "entries.auto.decisions[0].when.band: unknown band 'hard' "
                               "(bands of difficulty: none defined)")
