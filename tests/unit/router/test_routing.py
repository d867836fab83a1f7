from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import fields, replace

import pytest

from services.router.config import parse_config
from services.router.decision.decisions import NoEligibleDecision
from services.router.decision.engine import Choice, Router, UnknownModel
from services.router.decision.signals import request_text

CONFIG = {
    "listeners": [{"port": 8080}],
    "pools": {name: {"model": f"{name}-m", "replicas": [{"url": f"http://{name}:8000"}]}
              for name in ("small", "big", "other")},
    "entries": {
        "static": {"signals": [{"name": "code", "type": "regex", "pattern": "def "}],
                   "decisions": [{"name": "code", "when": "code", "pools": ["big", "small"]}],
                   "default": ["small", "other"]},
        "weighted": {"default": ["small", "big", "other"],
                     "algorithm": {"type": "weighted", "weights": {"small": 3, "big": 1}}},
        "escalate": {"default": ["small"],
                     "algorithm": {"type": "escalate", "stages": ["small", "big"],
                                   "accept": {"finish_reasons": ["stop"], "min_chars": 3, "regex": "ok"}}},
    },
}


class SyncRouter(Router):
    """The router with `choose` run to completion (these tests need no event loop of their own)."""

    def choose_now(self, body: dict) -> Choice:  # type: ignore[type-arg]
        return asyncio.run(self.choose(body))


def _router() -> SyncRouter:
    return SyncRouter(parse_config(CONFIG), rng=random.Random(7))


def _body(model: str, text: str = "hello") -> dict:  # type: ignore[type-arg]
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def test_static_plan_is_the_candidates_in_order() -> None:
    router = _router()
    assert router.choose_now(_body("static")).plan == ("small", "other")
    code = router.choose_now(_body("static", "def f(): pass"))
    assert code.decision.name == "code" and code.plan == ("big", "small")
    assert code.describe()["signals"]["code"]["matched"] is True


def test_weighted_draws_the_first_pool_by_weight_then_the_rest_in_order() -> None:
    router = _router()
    plans = [router.choose_now(_body("weighted")).plan for _ in range(5000)]
    firsts = Counter(p[0] for p in plans)
    # small 3, big 1, other unlisted = 1: shares 0.6, 0.2, 0.2.
    assert abs(firsts["small"] / 5000 - 0.6) < 0.03 and abs(firsts["big"] / 5000 - 0.2) < 0.03
    assert all(sorted(p) == ["big", "other", "small"] for p in plans)
    assert ("big", "small", "other") in plans


def test_escalate_plan_is_its_stages() -> None:
    assert _router().choose_now(_body("escalate")).plan == ("small", "big")


def test_unknown_model() -> None:
    with pytest.raises(UnknownModel, match="available: static, weighted, escalate"):
        _router().choose_now(_body("nope"))


def test_choose_now_made_once_for_an_entry_with_no_signal_is_still_each_requests_own() -> None:
    """choose_now keeps the choice of an entry with no signals and no draw (the config alone decides it):
    each request gets it with its own text, as choose makes it; a drawn plan and a signal are still each
    request's own, and a choice kept for one output is not another output's."""
    config = {**CONFIG, "entries": {**CONFIG["entries"], "plain": {"default": ["small", "other"]}}}  # type: ignore[dict-item]
    router = Router(parse_config(config), rng=random.Random(7))
    for text in ("hello", "def f(): pass", "hello"):
        now, made = _now(router, _body("plain", text)), asyncio.run(router.choose(_body("plain", text)))
        assert now is not None and now.text == made.text == text
        assert (now.entry, now.decision, now.plan, now.signals, now.projections, now.skipped, now.models_s) == (
            made.entry, made.decision, made.plan, made.signals, made.projections, made.skipped, made.models_s)
    firsts = Counter(_now(router, _body("weighted")).plan[0] for _ in range(2000))  # type: ignore[union-attr]
    assert set(firsts) == {"small", "big", "other"}
    code, plain = _now(router, _body("static", "def f(): pass")), _now(router, _body("static"))
    assert code is not None and plain is not None
    assert (code.decision.name, plain.plan) == ("code", ("small", "other"))
    with pytest.raises(NoEligibleDecision):  # no pool of its declares images: kept for text, not for image
        _now(router, _body("plain"), outputs="image")
    assert _now(router, _body("plain")).plan == ("small", "other")  # type: ignore[union-attr]


def test_choose_keeps_the_choice_of_an_entry_with_no_signal_as_choose_now_does() -> None:
    """The ASGI path's `choose` keeps (and reuses) the same choice as choose_now for an entry with no signal and
    no draw, each request's with its own text; a choice kept by one is the other's too."""
    config = {**CONFIG, "entries": {**CONFIG["entries"], "plain": {"default": ["small", "other"]}}}  # type: ignore[dict-item]
    router = Router(parse_config(config), rng=random.Random(7))
    first = asyncio.run(router.choose(_body("plain", "one")))
    again = asyncio.run(router.choose(_body("plain", "two")))
    assert (first.text, again.text) == ("one", "two")
    assert again.decision is first.decision and again.plan == first.plan == ("small", "other")  # made once
    now = _now(router, _body("plain", "three"))
    assert now is not None and now.decision is first.decision and now.text == "three"
    fresh = Router(parse_config(config), rng=random.Random(7))
    kept_by_now = _now(fresh, _body("plain", "four"))
    assert kept_by_now is not None
    assert asyncio.run(fresh.choose(_body("plain", "five"))).decision is kept_by_now.decision
    signalled = [asyncio.run(router.choose(_body("static", t))) for t in ("def f(): pass", "hello")]
    assert [c.decision.name for c in signalled] == ["code", "default"]  # a signal still decides each request
    assert len({c.plan[0] for c in (asyncio.run(router.choose(_body("weighted"))) for _ in range(300))}) == 3


def _now(router: Router, body: dict, outputs: str = "text") -> Choice | None:  # type: ignore[type-arg]
    return router.choose_now(body, request_text(body), outputs=outputs)


def test_with_text_is_replace() -> None:
    """Choice.with_text builds what dataclasses.replace would: every field but the text kept (a field added
    to Choice and not to with_text fails here)."""
    choice = asyncio.run(_router().choose(_body("static", "def f(): pass")))
    choice.models_s, choice.skipped = 0.5, {"x": "why"}
    assert choice.with_text("other") == replace(choice, text="other")
    other = choice.with_text("t")
    assert all(getattr(other, f.name) is getattr(choice, f.name) for f in fields(choice) if f.name != "text")
