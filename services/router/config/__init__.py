"""The router's configuration (run once at start by the router process): the types (types.py), read
from YAML and checked by the loader (loader.py) with its field readers (fields.py) and value rules
(rules.py). Everything callers import is re-exported here."""
from __future__ import annotations

from services.router.config.loader import load_config, parse_config, read_yaml
from services.router.config.types import (
    ALGORITHM_TYPES,
    APIS,
    BACKENDS,
    FINISH_REASONS,
    POLICIES,
    REGEX_FLAGS,
    SIGNAL_TYPES,
    TASKS,
    AcceptConfig,
    Algorithm,
    AllOf,
    AnyOf,
    AttachedConfig,
    BreakerConfig,
    CacheAwareConfig,
    ConfigError,
    ContextLengthSignal,
    DecisionRule,
    DeploymentConfig,
    DnsConfig,
    EmbeddingSignal,
    EntryConfig,
    EscalateAlgorithm,
    Expr,
    HealthConfig,
    KeywordSignal,
    ListenerConfig,
    ManagedConfig,
    Not,
    PoolConfig,
    PrecisePrefixConfig,
    RegexSignal,
    ReplicaConfig,
    RouterConfig,
    Signal,
    SignalRef,
    StaticAlgorithm,
    WeightedAlgorithm,
)

__all__ = [
    "BACKENDS", "TASKS", "AttachedConfig", "DeploymentConfig", "ManagedConfig",
    "ALGORITHM_TYPES", "APIS", "FINISH_REASONS", "POLICIES", "REGEX_FLAGS", "SIGNAL_TYPES", "AcceptConfig",
    "Algorithm", "AllOf", "AnyOf", "BreakerConfig", "CacheAwareConfig", "ConfigError", "ContextLengthSignal",
    "DecisionRule", "DnsConfig", "EmbeddingSignal", "EntryConfig", "EscalateAlgorithm", "Expr", "HealthConfig",
    "KeywordSignal", "ListenerConfig", "Not", "PoolConfig", "PrecisePrefixConfig", "RegexSignal", "ReplicaConfig",
    "RouterConfig", "Signal", "SignalRef", "StaticAlgorithm", "WeightedAlgorithm", "load_config", "parse_config",
    "read_yaml",
]
