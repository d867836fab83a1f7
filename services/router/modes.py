"""The router's two modes from its command line (router process, once at start): engine mode's RouterConfig
(`-e MODEL ...`: System One for concrete models on managed workers, one listener, no chat), router mode's
default decision model (`--config FILE MODEL`), and the startup line that says which mode runs."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from checkpoints import CheckpointError, architectures
from services.router.config import (
    BACKENDS,
    DeploymentConfig,
    DomainSignal,
    EmbeddingSignal,
    EntryConfig,
    HealthConfig,
    ListenerConfig,
    ManagedConfig,
    RouterConfig,
    Signal,
    uses_local_embedder,
)
from services.router.config.deployments import MANAGED_HEALTH_PATH

# What each family serves (DeploymentConfig.tasks; its `family` reads them back).
FAMILY_TASKS = {"embedding": ("embed",), "classifier": ("classify",), "cross_encoder": ("score", "rerank")}
ENGINE_LISTENER = "engine"
ENGINE_HOST = "0.0.0.0"
ENGINE_PORT = 8080
ENGINE_SOURCE = "router -e"  # engine mode's RouterConfig.source: it comes from no file
API_KEYS_ENV = "ROUTER_API_KEYS"  # engine mode's API keys, comma separated, when no --api-key is given
DEFAULT_EMBEDDER = "default-embedder"  # router mode's deployment of the MODEL given on the command line

FamilyOf = Callable[[str], str | None]


class ModeError(ValueError):
    """A command line that cannot start; the message leads with the argument at fault."""


@dataclass(frozen=True, slots=True)
class EngineModel:
    """One model engine mode serves: its published name, its --model value and its family."""

    name: str
    model: str
    family: str


@dataclass(frozen=True, slots=True)
class Workers:
    """How the command line's managed deployments run: the engine backend and the replicas of each."""

    backend: str = "vllm"
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ModeError(f"--engine-backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not 1 <= self.replicas <= 64:  # the config's own bound (deployments.X.managed.replicas)
            raise ModeError(f"--replicas: expected 1..64, got {self.replicas}")


@dataclass(frozen=True, slots=True)
class Listen:
    """Engine mode's listener as the command line gives it: None where a flag (or the env) is absent."""

    host: str | None = None
    port: int | None = None
    api_keys: tuple[str, ...] | None = None


def engine_models(specs: Sequence[str], family_of: FamilyOf = architectures.family) -> tuple[EngineModel, ...]:
    """`-e` values (MODEL or NAME=MODEL) with their families from their checkpoints; a generative or
    unreadable checkpoint and a name given twice are refused."""
    models: list[EngineModel] = []
    for spec in specs:
        name, model = _split(spec)
        if any(m.name == name for m in models):
            raise ModeError(f"-e {spec}: the name {name!r} is given twice; publish one of them under another "
                            f"name (NAME=MODEL)")
        try:
            family = family_of(model)
        except CheckpointError as exc:
            raise ModeError(f"-e {spec}: {exc}") from exc
        if family is None:
            raise ModeError(f"-e {spec}: {model!r} is a generative (or unknown) architecture; engine mode serves "
                            f"decision models: {', '.join(FAMILY_TASKS)} (by config.json's architectures, or a "
                            f"sentence-transformers modules.json)")
        models.append(EngineModel(name, model, family))
    return tuple(models)


def _split(spec: str) -> tuple[str, str]:
    """(name, model) of MODEL or NAME=MODEL; a directory whose path holds '=' is a MODEL."""
    name, sep, model = spec.partition("=")
    if not sep or Path(spec).expanduser().is_dir():
        name, model = spec, spec
    if not name or not model or any(c.isspace() for c in name):
        raise ModeError(f"-e {spec!r}: expected MODEL or NAME=MODEL (a name without spaces, a --model value)")
    return name, model


def api_keys(flags: Sequence[str] | None, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Engine mode's keys: --api-key's, else $ROUTER_API_KEYS's (comma separated); None when neither."""
    if flags:
        keys = [k.strip() for k in flags]
        if not all(keys):
            # An empty key would match a request that sends none: `--api-key "$KEY"` with KEY unset must
            # not open the listener while the log counts a key.
            raise ModeError("--api-key: a key must be non-empty (is the variable it came from set?)")
        return tuple(dict.fromkeys(keys))
    keys = [k.strip() for k in env.get(API_KEYS_ENV, "").split(",") if k.strip()]
    return tuple(dict.fromkeys(keys)) or None


def engine_config(models: Sequence[EngineModel], workers: Workers, listen: Listen,
                  routing: RouterConfig | None = None) -> RouterConfig:
    """Engine mode's config: one listener publishing `models` as System One models, a managed deployment
    each; no pools, no entries. A routing file's first listener gives what `listen` leaves out."""
    first = routing.listeners[0] if routing is not None and routing.listeners else None
    host = listen.host if listen.host is not None else first.host if first is not None else ENGINE_HOST
    port = listen.port if listen.port is not None else first.port if first is not None else ENGINE_PORT
    keys = listen.api_keys if listen.api_keys is not None else first.api_keys if first is not None else ()
    listener = ListenerConfig(ENGINE_LISTENER, port, host, keys, apis=("systemone",),
                              systemone=tuple(m.name for m in models))
    deployments = {m.name: _managed(m.name, m.model, FAMILY_TASKS[m.family], workers) for m in models}
    return RouterConfig((listener,), {}, {}, ENGINE_SOURCE, deployments, mode="engine")


def _managed(name: str, model: str, tasks: tuple[str, ...], workers: Workers) -> DeploymentConfig:
    # The sim needs no engine flag of its own: the runtime passes --runner pooling and the head's --convert.
    return DeploymentConfig(name, model, tasks, managed=ManagedConfig(workers.replicas, workers.backend),
                            health=HealthConfig(path=MANAGED_HEALTH_PATH))  # as the loader sets it for managed


def with_default_model(config: RouterConfig, model: str, workers: Workers,
                       family_of: FamilyOf = architectures.family) -> tuple[RouterConfig, int]:
    """Router mode with MODEL: the signals that embed in-process (an embedding signal, a domain signal by
    examples, naming no deployment) use a managed deployment of MODEL instead, so the in-process model is
    never loaded. Returns the config and how many signals now use it."""
    try:
        family = family_of(model)
    except CheckpointError as exc:
        raise ModeError(f"MODEL {model!r}: {exc}") from exc
    if family != "embedding":
        raise ModeError(f"MODEL {model!r}: {_article(family)}; the default decision model embeds (embedding "
                        f"signals and domain signals by examples): give an embedding model (e.g. minilm)")
    if DEFAULT_EMBEDDER in config.deployments:
        raise ModeError(f"MODEL {model!r}: {config.source} already declares deployments.{DEFAULT_EMBEDDER}, the "
                        f"name MODEL's deployment takes; rename it, or name it in the signals instead of MODEL")
    entries: dict[str, EntryConfig] = {}
    moved = 0
    for name, entry in config.entries.items():
        signals = tuple(_to_default_embedder(s) for s in entry.signals)
        changed = sum(a is not b for a, b in zip(signals, entry.signals, strict=True))
        entries[name] = replace(entry, signals=signals) if changed else entry  # `needed` is derived again
        moved += changed
    deployment = _managed(DEFAULT_EMBEDDER, model, FAMILY_TASKS["embedding"], workers)
    return replace(config, entries=entries, deployments={**config.deployments, DEFAULT_EMBEDDER: deployment}), moved


def _to_default_embedder(signal: Signal) -> Signal:
    if isinstance(signal, (EmbeddingSignal, DomainSignal)) and uses_local_embedder(signal):
        return replace(signal, deployment=DEFAULT_EMBEDDER)
    return signal


def _article(family: str | None) -> str:
    return "a generative (or unknown) architecture" if family is None else f"a {family.replace('_', '-')} model"


def inactive_line(routing: RouterConfig) -> str:
    """Engine mode's report of a routing file given with -e: loaded and checked, not served."""
    return (f"engine mode: routing file {routing.source} loaded and inactive ({len(routing.entries)} entries, "
            f"{len(routing.pools)} pools not served)")


def startup_line(config: RouterConfig, pool_replicas: Mapping[str, int]) -> str:
    """The one line that says the mode and what it serves (pool_replicas: each pool's replicas at start)."""
    if config.mode == "engine":
        served = ", ".join(f"{name} ({d.family}, {d.model})" for name, d in config.deployments.items())
        return f"engine mode: System One for {served}; no chat backend"
    published = tuple(dict.fromkeys(name for listener in config.listeners for name in listener.systemone))
    pools = ", ".join(f"{name} ({n} replicas)" for name, n in pool_replicas.items())
    return (f"router mode: entries {', '.join(config.entries) or 'none'}; pools {pools or 'none'}; "
            f"System One models {', '.join(published) or 'none'}")
