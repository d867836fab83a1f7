"""Router configuration types: listeners, pools and entries, read from `router --config router.yaml`.

The router process builds them once at start (loader.py); every field is documented in
docs/router-config.md. A field's default is written here only: the loader reads it from the dataclass.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from services.router.config.admission import DEFAULT_KEY, NO_LIMITS, AdmissionConfig, KeySettings, Limits
from services.router.config.budget import (
    Budget,
    JudgeConfig,
    NativeEscalateAlgorithm,
)
from services.router.config.plugins import KnowledgeConfig, PluginConfig, StoreConfig

# A listener's public APIs. explain: where a request would be routed, not sent (POST /v1/router/explain;
# `decisions` in a list of apis is read as explain, its name before /v1/router/explain became System One's).
# systemone is published only with its models named (listeners[].apis.systemone.models). memory: GET and
# DELETE /v1/memory, a caller's own memories (served where some entry runs the memory plugin).
APIS = ("chat", "completions", "responses", "messages", "models", "explain", "images", "systemone", "memory")
DEFAULT_APIS = tuple(api for api in APIS if api != "systemone")
ENTRY_APIS = ("chat", "systemone")  # an entry's kind: a chat recipe, or a native System One recipe
POLICIES = ("least_outstanding", "cache_aware", "round_robin", "precise_prefix")
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
REGEX_FLAGS = {"ignorecase": re.IGNORECASE, "multiline": re.MULTILINE, "dotall": re.DOTALL,
               "verbose": re.VERBOSE, "ascii": re.ASCII}


class ConfigError(ValueError):
    """An invalid router config: `errors` holds every problem found, each led by its key path."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = tuple(errors)
        super().__init__("\n".join(f"{source}: {e}" for e in errors))


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    port: int
    host: str = "0.0.0.0"
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # empty: no authentication
    apis: tuple[str, ...] = DEFAULT_APIS
    entries: tuple[str, ...] = ()  # the chat entries (public model names) served here; empty: every chat entry
    systemone: tuple[str, ...] = ()  # System One models published here: deployments and native entries
    pools: tuple[str, ...] = ()  # chat pools published by name: a request naming one goes straight to it
    limits: Limits = NO_LIMITS  # per tenant: every key's, unless its own settings say otherwise
    user_limits: Limits = NO_LIMITS  # per user within a tenant, where a request names its user
    keys: Mapping[str, KeySettings] = field(default_factory=dict, repr=False)  # by the key itself

    def key_settings(self, key: str | None) -> KeySettings:
        """A key's admission settings: its own, or the defaults (also for an open listener's None)."""
        return self.keys.get(key, DEFAULT_KEY) if key is not None else DEFAULT_KEY


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    url: str  # scheme://host[:port][/prefix], no trailing slash
    grpc: str | None = None  # host:port of its frontend's gRPC (--grpc-port): KvEvents for precise_prefix


@dataclass(frozen=True, slots=True)
class DnsConfig:
    name: str  # resolved to every A/AAAA record; each address is one replica
    port: int = 8000
    scheme: str = "http"
    refresh_s: float = 10.0
    grpc_port: int | None = None  # the frontends' --grpc-port on each address: KvEvents for precise_prefix


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    cache_threshold: float = 0.5  # prefix match ratio above which the cached replica is preferred
    balance_abs: int = 16  # ... unless in-flight counts differ by more than this (below the cap of 32)
    balance_rel: float = 1.5  # ... and by more than this factor
    max_tree_chars: int = 2_000_000
    eviction_s: float = 120.0


@dataclass(frozen=True, slots=True)
class PrecisePrefixConfig:
    cache_threshold: float = 0.5  # share of the prompt's blocks held above which that replica is preferred
    balance_abs: int = 16  # ... unless in-flight counts differ by more than this
    balance_rel: float = 1.5  # ... and by more than this factor
    # A prompt's blocks count as held by the replica it was sent to for this long, until its engine reports them.
    pending_s: float = 5.0
    reconnect_max_s: float = 5.0  # the longest wait between attempts to resubscribe to a replica's events


@dataclass(frozen=True, slots=True)
class HealthConfig:
    path: str = "/health"
    interval_s: float = 5.0
    timeout_s: float = 2.0
    failures: int = 2  # consecutive failed checks that take a replica out


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 3  # consecutive failures that open the breaker
    cooldown_s: float = 10.0


@dataclass(frozen=True, slots=True)
class PoolConfig:
    name: str
    model: str  # model name sent upstream
    replicas: tuple[ReplicaConfig, ...] = ()  # exactly one of replicas / dns is set
    dns: DnsConfig | None = None
    max_inflight: int = 32  # per replica
    policy: str = "least_outstanding"
    cache_aware: CacheAwareConfig = CacheAwareConfig()
    precise_prefix: PrecisePrefixConfig = PrecisePrefixConfig()
    health: HealthConfig = HealthConfig()
    breaker: BreakerConfig = BreakerConfig()
    tokenizer: str | None = None  # a --model value (checkpoints.resolve): token counts, precise_prefix
    api_key: str | None = field(default=None, repr=False)  # bearer key sent upstream
    timeout_s: float = 600.0
    outputs: tuple[str, ...] = ("text",)  # of OUTPUTS: image pools serve /v1/images/generations
    queue_size: int = 0  # requests that may wait for a replica when every one is at its cap; 0: 429 at once


@dataclass(frozen=True, slots=True)
class KeywordSignal:
    type: ClassVar[str] = "keyword"
    name: str
    keywords: tuple[str, ...]
    mode: str = "any"  # any | all
    case_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class RegexSignal:
    type: ClassVar[str] = "regex"
    name: str
    pattern: str
    flags: tuple[str, ...] = ()
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bits = 0
        for flag in self.flags:
            bits |= REGEX_FLAGS[flag]
        # Compiled once here, so a request never pays for it.
        object.__setattr__(self, "compiled", re.compile(self.pattern, bits))


@dataclass(frozen=True, slots=True)
class ContextLengthSignal:
    type: ClassVar[str] = "context_length"
    name: str
    min_tokens: int = 0  # matched when min_tokens <= tokens < max_tokens
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingSignal:
    type: ClassVar[str] = "embedding"
    name: str
    examples: tuple[str, ...]
    threshold: float = 0.6  # cosine similarity to the closest example
    deployment: str | None = None  # an embed deployment; none: the router's in-process all-MiniLM-L6-v2

    @property
    def task(self) -> str:
        return "embed"


@dataclass(frozen=True, slots=True)
class ClassifierSignal:
    type: ClassVar[str] = "classifier"
    name: str
    deployment: str  # a classify deployment
    labels: tuple[str, ...]  # matched when the top label is one of these ...
    threshold: float = 0.5  # ... with at least this probability

    @property
    def task(self) -> str:
        return "classify"


@dataclass(frozen=True, slots=True)
class DomainSignal:
    """The request's domain: the top label of a classifier, or, with `examples`, the label whose
    examples are closest to the text (by an embed deployment, or the in-process model without one)."""

    type: ClassVar[str] = "domain"
    name: str
    domains: tuple[str, ...]  # matched when the domain is one of these ...
    threshold: float = 0.5  # ... with a probability (or similarity) of at least this
    deployment: str | None = None  # a classify deployment; with examples an embed deployment
    examples: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (label, its example texts), in file order

    @property
    def task(self) -> str:
        return "embed" if self.examples else "classify"


@dataclass(frozen=True, slots=True)
class RerankSignal:
    type: ClassVar[str] = "rerank"
    name: str
    deployment: str  # a rerank deployment (a cross-encoder)
    examples: tuple[str, ...]  # the documents the request text is scored against
    threshold: float = 0.5  # the best relevance score must reach this

    @property
    def task(self) -> str:
        return "rerank"


Signal: TypeAlias = (KeywordSignal | RegexSignal | ContextLengthSignal | EmbeddingSignal | ClassifierSignal
                     | DomainSignal | RerankSignal)
ModelSignal: TypeAlias = EmbeddingSignal | ClassifierSignal | DomainSignal | RerankSignal
SIGNAL_TYPES: dict[str, type] = {s.type: s for s in (KeywordSignal, RegexSignal, ContextLengthSignal,
                                                      EmbeddingSignal, ClassifierSignal, DomainSignal,
                                                      RerankSignal)}
# Signals answered by a model: each has a score, and `task`, what it asks of its deployment (if it names one).
MODEL_SIGNAL_TYPES = (EmbeddingSignal, ClassifierSignal, DomainSignal, RerankSignal)


def uses_local_embedder(signal: Signal) -> bool:
    """Whether the signal embeds with the router's in-process model (an embedding signal, or a domain
    signal by examples, that names no deployment)."""
    if isinstance(signal, EmbeddingSignal):
        return signal.deployment is None
    return isinstance(signal, DomainSignal) and bool(signal.examples) and signal.deployment is None


@dataclass(frozen=True, slots=True)
class ProjectionInput:
    signal: str
    weight: float
    value: str = "matched"  # matched: 1 when the signal matched, else 0; score: the signal's score
    unknown: float = 0.0  # what an unknown signal (its model did not answer) counts as


@dataclass(frozen=True, slots=True)
class Band:
    name: str
    min: float | None = None  # the band holds sums >= min, up to the next band's min; none: the first band


@dataclass(frozen=True, slots=True)
class Projection:
    """A number derived from signals: the weighted sum of its inputs, and the band it falls in."""

    name: str
    inputs: tuple[ProjectionInput, ...]
    bands: tuple[Band, ...]  # ascending by min


@dataclass(frozen=True, slots=True)
class SignalRef:
    name: str


@dataclass(frozen=True, slots=True)
class AnyOf:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class AllOf:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not:
    item: Expr


@dataclass(frozen=True, slots=True)
class ProjectionRef:
    projection: str
    bands: tuple[str, ...]  # true when the projection's sum falls in one of these bands


Expr: TypeAlias = SignalRef | ProjectionRef | AnyOf | AllOf | Not


def references(expr: Expr) -> list[SignalRef | ProjectionRef]:
    """The signal and projection references in an expression, in order."""
    if isinstance(expr, (SignalRef, ProjectionRef)):
        return [expr]
    if isinstance(expr, Not):
        return references(expr.item)
    return [ref for item in expr.items for ref in references(item)]


@dataclass(frozen=True, slots=True)
class DecisionRule:
    name: str
    when: Expr
    pools: tuple[str, ...]  # candidate pools, in order; a native entry's: deployments, its escalate stages
    budget: Budget | None = None  # a native entry's decision: tightens the entry's (never loosens)
    plugins: tuple[PluginConfig, ...] | None = None  # run at its hooks, in order; None: the entry's


@dataclass(frozen=True, slots=True)
class StaticAlgorithm:
    type: ClassVar[str] = "static"


@dataclass(frozen=True, slots=True)
class WeightedAlgorithm:
    type: ClassVar[str] = "weighted"
    weights: Mapping[str, float]  # pool -> relative share; candidates not listed weigh 1


@dataclass(frozen=True, slots=True)
class AcceptConfig:
    finish_reasons: tuple[str, ...] = ("stop",)
    min_chars: int = 1
    regex: str | None = None  # the answer must contain a match (re.search)
    compiled: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", None if self.regex is None else re.compile(self.regex))


@dataclass(frozen=True, slots=True)
class EscalateAlgorithm:
    type: ClassVar[str] = "escalate"
    stages: tuple[str, ...]  # pools, cheapest first
    accept: AcceptConfig = AcceptConfig()
    deadline_s: float = 30.0  # for all stages together
    max_calls: int = 2
    judge: JudgeConfig | None = None  # when no stage is accepted: may pick one of the complete answers


Algorithm: TypeAlias = StaticAlgorithm | WeightedAlgorithm | EscalateAlgorithm
ALGORITHM_TYPES: dict[str, type] = {a.type: a for a in (StaticAlgorithm, WeightedAlgorithm,
                                                         EscalateAlgorithm)}


@dataclass(frozen=True, slots=True)
class EntryConfig:
    """A public model name and its recipe. `api: chat` (the default) routes chat among pools; `api:
    systemone` is a native System One recipe: its candidates are deployments, its algorithm a
    NativeEscalateAlgorithm, and `budget` bounds its signals and stages together."""

    name: str  # the public model name clients ask for
    default: tuple[str, ...]  # candidate pools when no decision matches (native: deployments, the stages)
    signals: tuple[Signal, ...] = ()
    decisions: tuple[DecisionRule, ...] = ()  # ordered; the first match wins
    algorithm: Algorithm | NativeEscalateAlgorithm = StaticAlgorithm()
    projections: tuple[Projection, ...] = ()
    signal_budget_s: float = 0.5  # the most a request waits for its model-backed signals
    api: str = "chat"  # of ENTRY_APIS
    budget: Budget | None = None  # native only: the request's deadline and call cap (signals and stages)
    plugins: tuple[PluginConfig, ...] = ()  # run for the default, and for decisions that list none
    # Signals some decision uses, directly or through a projection: the others are never evaluated.
    needed: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        projections = {p.name: p for p in self.projections}
        needed: set[str] = set()
        for rule in self.decisions:
            for ref in references(rule.when):
                if isinstance(ref, SignalRef):
                    needed.add(ref.name)
                elif ref.projection in projections:
                    needed.update(i.signal for i in projections[ref.projection].inputs)
        object.__setattr__(self, "needed", frozenset(needed))

    def plugins_of(self, decision: str, matched_default: bool) -> tuple[PluginConfig, ...]:
        """What runs for a request routed by the rule named `decision`, or by the default."""
        if not matched_default:
            for rule in self.decisions:
                if rule.name == decision and rule.plugins is not None:
                    return rule.plugins
        return self.plugins

    @property
    def native(self) -> bool:
        """A System One recipe (api: systemone), not a chat one."""
        return self.api == "systemone"

    @property
    def uses_local_embedder(self) -> bool:
        """Whether a needed signal embeds in-process (the router then loads all-MiniLM-L6-v2 at start)."""
        return any(uses_local_embedder(s) for s in self.signals if s.name in self.needed)

    def deployments_used(self) -> dict[str, tuple[str, ...]]:
        """Deployment -> the names of the needed signals that call it (what makes the runtime start it)."""
        used: dict[str, tuple[str, ...]] = {}
        for s in self.signals:
            deployment = getattr(s, "deployment", None)
            if deployment is not None and s.name in self.needed:
                used[deployment] = used.get(deployment, ()) + (s.name,)
        return used


# ---- decision-model deployments (the model runtime's; read by config/deployments.py) ----

# What a signal may ask a deployment (the DecisionModels call that serves it): embed -> embed,
# classify -> classify, score and rerank -> rerank (a cross-encoder scores query-document pairs).
TASKS = ("embed", "classify", "score", "rerank")
BACKENDS = ("vllm", "sim")


@dataclass(frozen=True, slots=True)
class ManagedConfig:
    replicas: int = 1  # engine + frontend process pairs, each one worker
    backend: str = "vllm"  # the engine's --backend
    engine_args: tuple[str, ...] = ()  # extra engine flags (e.g. --convert classify, --max-model-len 512)
    frontend_args: tuple[str, ...] = ()  # extra frontend flags


@dataclass(frozen=True, slots=True)
class AttachedConfig:
    urls: tuple[str, ...]  # scheme://host[:port][/prefix], no trailing slash
    api_key: str | None = field(default=None, repr=False)  # bearer key sent to them
    api: str = "pooling"  # of ATTACHED_APIS: vLLM's pooling API, or a System One API (model: its name there)


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    name: str
    model: str  # identity: a --model value (managed: resolved by checkpoints.resolve); the served name
    tasks: tuple[str, ...]  # of TASKS
    revision: str | None = None  # recorded and shown, never interpreted
    managed: ManagedConfig | None = None  # exactly one of managed / attached is set
    attached: AttachedConfig | None = None
    max_inflight: int = 32  # per worker
    timeout_s: float = 10.0  # the longest one call may take, whatever deadline the caller gives
    start_timeout_s: float = 600.0  # managed: the longest a worker may take to become ready at start
    health: HealthConfig = HealthConfig()
    breaker: BreakerConfig = BreakerConfig()
    labels: tuple[str, ...] = ()  # classify: class names by index, when the checkpoint cannot be read here

    @property
    def family(self) -> str:
        """What it answers as a System One model (of FAMILIES): embed -> embedding, classify ->
        classifier, score or rerank alone -> cross_encoder (the loader refuses embed with classify)."""
        if "embed" in self.tasks:
            return "embedding"
        return "classifier" if "classify" in self.tasks else "cross_encoder"

# ---- end of deployments ----


@dataclass(frozen=True, slots=True)
class RouterConfig:
    listeners: tuple[ListenerConfig, ...]
    pools: Mapping[str, PoolConfig]  # in file order
    entries: Mapping[str, EntryConfig]  # in file order
    source: str = "<config>"
    deployments: Mapping[str, DeploymentConfig] = field(default_factory=dict)  # in file order
    mode: str = "router"  # router: --config routes chat and serves System One; engine: -e, System One only
    store: StoreConfig | None = None  # the plugins' and Responses state's store; None: no state is kept
    knowledge: Mapping[str, KnowledgeConfig] = field(default_factory=dict)  # knowledge bases, by name
    admission: AdmissionConfig = AdmissionConfig()  # priority classes, shared limits

    @property
    def chat_entries(self) -> tuple[str, ...]:
        """The chat recipes' names (a native System One recipe is never a chat model)."""
        return tuple(name for name, entry in self.entries.items() if not entry.native)

    @property
    def native_entries(self) -> tuple[str, ...]:
        return tuple(name for name, entry in self.entries.items() if entry.native)

    def family_of(self, name: str) -> str | None:
        """A System One name's family: a deployment's own, a native recipe's its first stage's (the
        loader holds every stage of a recipe to one family); None: neither."""
        entry = self.entries.get(name)
        stage = entry.default[0] if entry is not None and entry.native and entry.default else name
        deployment = self.deployments.get(stage)
        return deployment.family if deployment is not None else None

