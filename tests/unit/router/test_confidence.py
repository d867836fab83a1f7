"""A System One answer's confidence and the native escalate's verdict on it
(services/router/decision/confidence.py)."""
from __future__ import annotations

import pytest

from services.router.config import ConfidenceAccept
from services.router.decision.confidence import confidence, verdict
from services.router.runtime.models import Label


def _label(top: str, probs: dict[str, float]) -> Label:
    return Label(top, probs[top], probs)


def test_a_classifiers_confidence_is_its_top_probability_and_the_margin_to_the_runner_up() -> None:
    assert confidence(_label("b", {"a": 0.25, "b": 0.6, "c": 0.15})) == pytest.approx((0.6, 0.35))
    assert confidence(_label("a", {"a": 0.5, "b": 0.5})) == (0.5, 0.0)  # a tie: no margin
    assert confidence(_label("only", {"only": 0.9})) == (0.9, 0.9)  # one class: the runner-up counts as 0
    assert confidence(Label("x", 0.7, {})) == (0.7, 0.7)  # no probs given: nothing else in the running


def test_a_cross_encoders_confidence_is_its_best_score_and_the_margin_to_the_second() -> None:
    assert confidence((0.1, 0.9, 0.7)) == pytest.approx((0.9, 0.2))
    assert confidence((0.4,)) == (0.4, 0.4)
    assert confidence((-2.0, -3.5)) == (-2.0, 1.5)  # logits: the margin is still best minus second
    assert confidence(()) == (0.0, 0.0)


def test_the_verdict_says_which_condition_failed_and_by_how_much() -> None:
    accept = ConfidenceAccept(min_probability=0.8, min_margin=0.3)
    assert verdict(accept, _label("a", {"a": 0.85, "b": 0.15})) is None
    assert verdict(accept, _label("a", {"a": 0.41, "b": 0.3, "c": 0.29})) == \
        "top probability 0.41 < min_probability 0.8"
    assert verdict(accept, _label("a", {"a": 0.81, "b": 0.6})) == \
        "margin 0.21 to the runner-up < min_margin 0.3"
    assert verdict(accept, (0.5, 0.2)) == "best score 0.5 < min_probability 0.8"
    assert verdict(accept, (0.95, 0.9)) == "margin 0.05 to the runner-up < min_margin 0.3"
    assert verdict(accept, (0.95, 0.1)) is None


def test_a_margin_exactly_at_the_minimum_passes_though_floats_make_it_a_hair_less() -> None:
    assert 0.7 - 0.2 < 0.5  # the case: written as 0.5, computed a little under it
    assert verdict(ConfidenceAccept(min_margin=0.5), _label("a", {"a": 0.7, "b": 0.2})) is None
    assert verdict(ConfidenceAccept(min_margin=0.5), _label("a", {"a": 0.7, "b": 0.21})) is not None


def test_the_default_accepts_every_answer() -> None:
    assert verdict(ConfidenceAccept(), _label("a", {"a": 0.34, "b": 0.33, "c": 0.33})) is None
    assert verdict(ConfidenceAccept(), (0.0, 0.0)) is None
