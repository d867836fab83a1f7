"""The decision engine (router process, on its event loop): for one request, the entry by public model
name, the signals its decisions need (rule signals inline, model signals concurrently within the
entry's budget), its projections, the first matching decision (or the default), and the plan of pools
its algorithm will call."""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tracing
from services.router.config import MODEL_SIGNAL_TYPES, EntryConfig, EscalateAlgorithm, ModelSignal, RouterConfig
from services.router.decision import algorithms
from services.router.decision.decisions import Decision, NoEligibleDecision, decide, models_needed
from services.router.decision.model_signals import ModelSignals
from services.router.decision.projections import ProjectionResult, project_all
from services.router.decision.signals import (
    RuleSignal,
    SignalResult,
    evaluate_rules,
    request_text,
    tokenizer_counter,
)
from services.router.runtime.models import DecisionModels

log = logging.getLogger(__name__)


class UnknownModel(LookupError):
    pass


@dataclass(slots=True)
class Choice:
    entry: EntryConfig
    text: str
    signals: dict[str, SignalResult]  # the signals evaluated, in config order
    decision: Decision
    plan: tuple[str, ...]  # pools in the order to try them, or the escalate stages
    projections: dict[str, ProjectionResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # signals not evaluated, and why
    models_s: float | None = None  # how long the request waited for its model signals; None: it needed none

    def with_text(self, text: str) -> Choice:
        """This choice for a request whose text is `text` (dataclasses.replace's result, without its field walk)."""
        return Choice(self.entry, text, self.signals, self.decision, self.plan, self.projections, self.skipped,
                      self.models_s)

    def describe(self) -> dict[str, Any]:
        return {
            "entry": self.entry.name,
            "signals": {name: {"type": r.type, "matched": r.matched, "unknown": r.unknown, "score": r.score,
                               "detail": r.detail, "reason": r.reason, "label": r.label, "worker": r.worker,
                               "latency_s": r.latency_s}
                        for name, r in self.signals.items()},
            "skipped": self.skipped,
            "signal_budget_s": self.entry.signal_budget_s,
            "models_s": self.models_s,
            "projections": {name: {"sum": p.sum, "band": p.band, "terms": p.terms, "unknown": list(p.unknown)}
                            for name, p in self.projections.items()},
            "decision": self.decision.name,
            "matched_default": self.decision.matched_default,
            "passed_over": list(self.decision.unknown),  # rules whose condition was unknown
            "candidates": list(self.decision.pools),
            "algorithm": type(self.entry.algorithm).type,
            "plan": list(self.plan),
        }


class Router:
    def __init__(self, config: RouterConfig, *, models: DecisionModels | None = None,
                 rng: random.Random | None = None) -> None:
        """`models`: the model runtime's deployments; without it, signals that name one are unknown."""
        self.config = config
        self._rng = rng or random.Random()
        self._counters: dict[str, Callable[[str], int]] = {}
        self.model_signals = ModelSignals(models)
        # Each entry's rule signals that its decisions need, in config order: what every request evaluates.
        self._rules = {name: _rules_of(entry) for name, entry in config.entries.items()}
        # The choice for an entry with no signals and no random draw, by (entry, outputs) (`_kept`).
        self._fixed: dict[tuple[str, str], Choice] = {}

    def load_models(self) -> None:
        """Once, before the first request: the tokenizers named by pools (context_length signals count
        with them), and the in-process embedding model only if a needed signal uses it (a config without
        one never imports it). The pools' own models load in backends/pool.py's `load_models`."""
        for name, pool in self.config.pools.items():
            if pool.tokenizer:
                self._counters[name] = tokenizer_counter(pool.tokenizer)
        if any(entry.uses_local_embedder for entry in self.config.entries.values()):
            from services.router.decision.embedding import Embedder

            self.model_signals.embedder = Embedder.load()

    async def warm(self) -> None:
        """Once the model runtime is ready, before the first request: every needed signal's examples
        embedded (a failure is logged, and those examples are embedded on first use instead)."""
        signals = [s for entry in self.config.entries.values() for s in _model_signals(entry, entry.needed)]
        for problem in await self.model_signals.warm(signals):
            log.warning("signal examples not embedded ahead of requests: %s", problem)

    async def choose(self, body: dict[str, Any], text: str | None = None, *, offload: bool = False,
                     outputs: str = "text", signal_budget_s: float | None = None) -> Choice:
        """`text`: the body's request_text, when the caller has it already (a System One request's body
        is no chat body: its caller gives the text and a body of the model alone). `offload`: count
        tokens in a thread (a long text), so that the event loop serves other requests meanwhile.
        `outputs`: what the request needs produced (of OUTPUTS): a chat entry's decisions whose candidate
        pools do not all declare it are passed over, and NoEligibleDecision raised when none is left (a
        native recipe's candidates are deployments, which produce no chat output: it is not filtered).
        `signal_budget_s`: at most this long for the model signals (a native recipe's deadline left),
        and never more than the entry's signal_budget_s."""
        entry, eligible = self._entry(body, outputs)
        text = request_text(body) if text is None else text
        kept = self._reused(entry, outputs, text)
        if kept is not None:
            return kept
        rules = self._rules_for(entry)
        count = self._counters.get(entry.default[0])
        with tracing.span("router.signals", {"router.entry": entry.name}) as span:
            if offload:
                results = await asyncio.to_thread(evaluate_rules, rules, text, token_count=count)
            else:
                results = evaluate_rules(rules, text, token_count=count)
            wanted, settled = models_needed(entry, results, eligible=eligible)
            waited = None
            if wanted:
                signals = _model_signals(entry, frozenset(wanted))
                start = time.perf_counter()
                budget_s = entry.signal_budget_s if signal_budget_s is None else min(entry.signal_budget_s,
                                                                                     signal_budget_s)
                results.update(await self.model_signals.evaluate(signals, text, budget_s))
                waited = time.perf_counter() - start
            if span is not None:
                span.set_attributes({"router.signals.evaluated": list(results),
                                     "router.signals.matched": [k for k, r in results.items() if r.matched]})
        return self._kept(entry, outputs, self._decided(entry, text, results, settled, eligible, waited))

    def choose_now(self, body: dict[str, Any], text: str, *, outputs: str = "text") -> Choice | None:
        """`choose` without waiting, for an entry whose decision rests on rule signals alone (its model
        signals, if any, not needed for this text): the Choice, or None, and nothing done, when a model
        signal must be asked (then `choose`). UnknownModel, NoEligibleDecision as `choose`."""
        entry, eligible = self._entry(body, outputs)
        kept = self._reused(entry, outputs, text)
        if kept is not None:
            return kept
        results = evaluate_rules(self._rules_for(entry), text, token_count=self._counters.get(entry.default[0]))
        wanted, settled = models_needed(entry, results, eligible=eligible)
        if wanted:
            return None
        return self._kept(entry, outputs, self._decided(entry, text, results, settled, eligible, None))

    def _kept(self, entry: EntryConfig, outputs: str, choice: Choice) -> Choice:
        """`choice`, kept for the entry's next requests for `outputs` when it has no signal and no draw: every
        request to it gets this choice but for its text (the decision rests on the config alone), made once
        (not while tracing: a traced request's decision is made, and its spans kept)."""
        if not entry.signals and not algorithms.draws(entry.algorithm, choice.decision.pools) and not tracing.enabled():
            self._fixed[entry.name, outputs] = choice.with_text("")
        return choice

    def _reused(self, entry: EntryConfig, outputs: str, text: str) -> Choice | None:
        """The choice `_kept` for the entry and `outputs`, for a request whose text is `text`; None when none is
        kept (or tracing is on)."""
        fixed = self._fixed.get((entry.name, outputs))
        return None if fixed is None or tracing.enabled() else fixed.with_text(text)

    def _rules_for(self, entry: EntryConfig) -> list[RuleSignal]:
        rules = self._rules.get(entry.name)
        return rules if rules is not None else _rules_of(entry)

    def _entry(self, body: dict[str, Any], outputs: str) -> tuple[EntryConfig, Callable[[tuple[str, ...]], bool]]:
        model = body.get("model")
        entry = self.config.entries.get(model) if isinstance(model, str) else None
        if entry is None:
            raise UnknownModel(f"The model `{model}` does not exist; available: {', '.join(self.config.entries)}")
        eligible = _every if entry.native else self._producing(outputs)
        if isinstance(entry.algorithm, EscalateAlgorithm) and not eligible(entry.algorithm.stages):
            raise NoEligibleDecision(entry.name)  # escalate calls its stages whatever the decision
        return entry, eligible

    def _decided(self, entry: EntryConfig, text: str, results: dict[str, Any], settled: str | None,
                 eligible: Callable[[tuple[str, ...]], bool], waited: float | None) -> Choice:
        with tracing.span("router.decision", {"router.entry": entry.name}) as span:
            ordered = {s.name: results[s.name] for s in entry.signals if s.name in results}
            projections = project_all(entry.projections, ordered)
            decision = decide(entry, ordered, projections, eligible=eligible)
            skipped = {s.name: _why_skipped(entry, s.name, settled) for s in entry.signals if s.name not in results}
            plan = algorithms.plan(entry.algorithm, decision.pools, self._rng)
            if span is not None:
                span.set_attributes({"router.decision": decision.name, "router.plan": list(plan),
                                     "router.matched_default": decision.matched_default})
        return Choice(entry, text, ordered, decision, plan, projections, skipped, waited)

    def _producing(self, output: str) -> Callable[[tuple[str, ...]], bool]:
        """Whether every pool of a candidate list declares `output` in its PoolConfig.outputs."""
        pools = self.config.pools
        return lambda names: all(name in pools and output in pools[name].outputs for name in names)


def _every(names: tuple[str, ...]) -> bool:
    return True


def _rules_of(entry: EntryConfig) -> list[RuleSignal]:
    """The entry's rule signals its decisions need, in config order."""
    return [s for s in entry.signals if s.name in entry.needed and not isinstance(s, MODEL_SIGNAL_TYPES)]


def _model_signals(entry: EntryConfig, names: frozenset[str]) -> list[ModelSignal]:
    return [s for s in entry.signals if s.name in names and isinstance(s, MODEL_SIGNAL_TYPES)]


def _why_skipped(entry: EntryConfig, name: str, settled: str | None) -> str:
    if name not in entry.needed:
        return "no decision uses it"
    if settled is not None:
        return f"not needed: decision {settled!r} held on rule signals"
    return "not needed: the decisions that use it were settled by rule signals"
