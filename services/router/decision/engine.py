"""The router's decision for one request: entry by public model name, its signals, the first matching
decision (or the default), and the plan of pools its algorithm will call. No I/O."""
from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.router.backends.policies import build_policy
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.pool import Pool
from services.router.config import (
    EntryConfig,
    EscalateAlgorithm,
    PoolConfig,
    RouterConfig,
    WeightedAlgorithm,
)
from services.router.decision.decisions import Decision, decide
from services.router.decision.signals import (
    SignalResult,
    evaluate,
    request_text,
    tokenizer_counter,
)
from services.router.prompt import PromptModel

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
        self.pools = {name: _build_pool(p) for name, p in config.pools.items()}
        self._rng = rng or random.Random()
        self._counters: dict[str, Callable[[str], int]] = {}
        self.embedder: Any = None

    def load_models(self) -> None:
        """Once, before the first request: tokenizers (and precise_prefix's chat templates) named by
        pools, and the embedding model only if some signal uses it (a config without embedding signals
        never imports it)."""
        for name, pool in self.config.pools.items():
            if pool.tokenizer:
                self._counters[name] = tokenizer_counter(pool.tokenizer)
            policy = self.pools[name].policy
            if isinstance(policy, PrecisePrefix):
                policy.upstream_model = pool.model
                if pool.tokenizer:
                    policy.model = PromptModel.load(pool.tokenizer)
        if any(entry.uses_embedding for entry in self.config.entries.values()):
            from services.router.decision.embedding import Embedder

            self.embedder = Embedder.load()

    def choose(self, body: dict[str, Any]) -> Choice:
        model = body.get("model")
        entry = self.config.entries.get(model) if isinstance(model, str) else None
        if entry is None:
            raise UnknownModel(f"The model `{model}` does not exist; available: {', '.join(self.config.entries)}")
        text = request_text(body)
        results = evaluate(entry, text, token_count=self._counters.get(entry.default[0]), embedder=self.embedder)
        decision = decide(entry, results)
        return Choice(entry, text, results, decision, self._plan(entry, decision))

    def _plan(self, entry: EntryConfig, decision: Decision) -> tuple[str, ...]:
        """Escalate: its stages. Otherwise the candidates in the order to try them: a pool with no free
        replica passes the request to the next candidate. Weighted draws the first by weight."""
        algorithm = entry.algorithm
        if isinstance(algorithm, EscalateAlgorithm):
            return tuple(algorithm.stages)
        candidates = decision.pools
        if isinstance(algorithm, WeightedAlgorithm) and len(candidates) > 1:
            weights = [float(algorithm.weights.get(p, 1.0)) for p in candidates]
            first = self._rng.choices(candidates, weights)[0]
            return (first,) + tuple(p for p in candidates if p != first)
        return tuple(candidates)


def _build_pool(config: PoolConfig) -> Pool:
    urls = [r.url for r in config.replicas]
    return Pool(config.name, urls, policy=build_policy(config), max_inflight=config.max_inflight,
                failures=config.breaker.failures, cooldown_s=config.breaker.cooldown_s,
                unhealthy_after=config.health.failures)
