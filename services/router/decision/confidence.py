"""A System One stage answer's confidence (router process; pure, no I/O): a classifier's top probability
and its margin to the runner-up, or a cross-encoder's best score and its margin to the second best; and
the native escalate's verdict on it (decision/native.py asks it of every answer)."""
from __future__ import annotations

from services.router.config import ConfidenceAccept
from services.router.runtime.models import Label

EPSILON = 1e-9


def confidence(output: Label | tuple[float, ...]) -> tuple[float, float]:
    """(top, margin): a classifier's top class probability and top minus the runner-up's, or a
    cross-encoder's best score and best minus the second best. With one class (one document) the
    runner-up counts as 0: nothing else was in the running. No scores at all: (0, 0)."""
    if isinstance(output, Label):
        runner_up = max((p for name, p in output.probs.items() if name != output.label), default=0.0)
        return output.probability, output.probability - runner_up
    if not output:
        return 0.0, 0.0
    best, *rest = sorted(output, reverse=True)
    return best, best - (rest[0] if rest else 0.0)


def verdict(accept: ConfidenceAccept, output: Label | tuple[float, ...]) -> str | None:
    """None when the answer is accepted (top >= min_probability and margin >= min_margin), else one
    line why not, for the log and the response."""
    top, margin = confidence(output)
    # A margin is a difference of floats: 0.7 - 0.2 falls a hair under 0.5, which the user wrote to pass.
    what = "top probability" if isinstance(output, Label) else "best score"
    if top < accept.min_probability:
        return f"{what} {top:.3g} < min_probability {accept.min_probability:g}"
    if margin < accept.min_margin - EPSILON:
        return f"margin {margin:.3g} to the runner-up < min_margin {accept.min_margin:g}"
    return None
