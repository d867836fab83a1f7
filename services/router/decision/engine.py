"""The decision engine (router process): for one request, the entry by public model name, its signals,
the first matching decision (or the default), and the plan of pools its algorithm will call. No I/O."""
from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.router.config import EntryConfig, RouterConfig
from services.router.decision import algorithms
from services.router.decision.decisions import Decision, decide
from services.router.decision.signals import (
    SignalResult,
    evaluate,
    request_text,
    tokenizer_counter,
)

log = logging.getLogger(__name__)


class UnknownModel(LookupError):
    pass


@dataclass(slots=True)
class Choice:
    entry: EntryConfig
    text: str
    signals: dict[str, SignalResult]
    decision: Decision
    plan: tuple[str, ...]  # pools in the order to try them, or the escalate stages

    def describe(self) -> dict[str, Any]:
        return {
            "entry": self.entry.name,
            "signals": {name: {"type": r.type, "matched": r.matched, "detail": r.detail, "score": r.score}
                        for name, r in self.signals.items()},
            "decision": self.decision.name,
            "matched_default": self.decision.matched_default,
            "candidates": list(self.decision.pools),
            "algorithm": type(self.entry.algorithm).type,
            "plan": list(self.plan),
        }


class Router:
    def __init__(self, config: RouterConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._counters: dict[str, Callable[[str], int]] = {}
        self.embedder: Any = None

    def load_models(self) -> None:
        """Once, before the first request: the tokenizers named by pools (context_length signals count
        with them), and the embedding model only if some signal uses it (a config without embedding
        signals never imports it). The pools' own models load in backends/pool.py's `load_models`."""
        for name, pool in self.config.pools.items():
            if pool.tokenizer:
                self._counters[name] = tokenizer_counter(pool.tokenizer)
        if any(entry.uses_embedding for entry in self.config.entries.values()):
            from services.router.decision.embedding import Embedder

            self.embedder = Embedder.load()

    def choose(self, body: dict[str, Any], text: str | None = None) -> Choice:
        """`text`: the body's request_text, when the caller has it already."""
        model = body.get("model")
        entry = self.config.entries.get(model) if isinstance(model, str) else None
        if entry is None:
            raise UnknownModel(f"The model `{model}` does not exist; available: {', '.join(self.config.entries)}")
        text = request_text(body) if text is None else text
        results = evaluate(entry, text, token_count=self._counters.get(entry.default[0]), embedder=self.embedder)
        decision = decide(entry, results)
        return Choice(entry, text, results, decision, algorithms.plan(entry.algorithm, decision.pools, self._rng))
