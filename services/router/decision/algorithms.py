"""The algorithms of an entry's recipe (router process; pure, no I/O): the plan each makes of the matching
decision's candidates (static: in order; weighted: the first drawn by weight; escalate: its stages), and
escalate's verdict on a stage's whole answer (listeners/escalate.py calls the stages)."""
from __future__ import annotations

import random
from typing import Any, TypeGuard

from services.router.config import (
    AcceptConfig,
    Algorithm,
    EscalateAlgorithm,
    NativeEscalateAlgorithm,
    WeightedAlgorithm,
)


def plan(algorithm: Algorithm | NativeEscalateAlgorithm, candidates: tuple[str, ...],
         rng: random.Random) -> tuple[str, ...]:
    """Escalate: its stages (a native recipe's: the decision's candidates, its stages). Otherwise the
    candidates in the order to try them: a pool with no free replica passes the request to the next
    candidate. Weighted draws the first by weight."""
    if isinstance(algorithm, EscalateAlgorithm):
        return tuple(algorithm.stages)
    if draws(algorithm, candidates):
        weights = [float(algorithm.weights.get(p, 1.0)) for p in candidates]
        first = rng.choices(candidates, weights)[0]
        return (first,) + tuple(p for p in candidates if p != first)
    return tuple(candidates)


def draws(algorithm: Algorithm | NativeEscalateAlgorithm, candidates: tuple[str, ...]) -> TypeGuard[WeightedAlgorithm]:
    """Whether `plan` draws at random for these candidates (else its plan is the same every time)."""
    return isinstance(algorithm, WeightedAlgorithm) and len(candidates) > 1


def answer_text(completion: dict[str, Any]) -> tuple[str, str | None]:
    """The first choice's text and finish_reason, for chat and completions bodies alike."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return (text if isinstance(text, str) else ""), choice.get("finish_reason")


def verdict(accept: AcceptConfig, completion: dict[str, Any]) -> str | None:
    """None when the answer is accepted, else why not (one line, for the log and the response)."""
    text, finish = answer_text(completion)
    if finish not in accept.finish_reasons:
        return f"finish_reason {finish!r} not in {list(accept.finish_reasons)}"
    if len(text) < accept.min_chars:
        return f"{len(text)} chars < min_chars {accept.min_chars}"
    if accept.compiled is not None and not accept.compiled.search(text):
        return f"no match for {accept.regex!r}"
    return None
