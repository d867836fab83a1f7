from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from services.router.config import parse_config
from services.router.decision.engine import Choice, Router, UnknownModel

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
