"""Read the router's YAML file and build a RouterConfig from it, collecting every problem with its
key path. Run once by the router process at start (`load_config`, or `parse_config` on parsed YAML).
Defaults come from the dataclasses in types.py (`defaults`), never written here again.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from services.router.config import admission_reader, plugins_reader, recipe, rules, systemone
from services.router.config.admission import AdmissionConfig
from services.router.config.budget import NativeEscalateAlgorithm
from services.router.config.deployments import read_deployments
from services.router.config.fields import MISSING, Fields, defaults
from services.router.config.types import (
    ALGORITHM_TYPES,
    FINISH_REASONS,
    POLICIES,
    AcceptConfig,
    Algorithm,
    BreakerConfig,
    CacheAwareConfig,
    ConfigError,
    DecisionRule,
    DnsConfig,
    EntryConfig,
    EscalateAlgorithm,
    HealthConfig,
    ListenerConfig,
    PoolConfig,
    PrecisePrefixConfig,
    ReplicaConfig,
    RouterConfig,
    Signal,
    StaticAlgorithm,
    WeightedAlgorithm,
)

T = TypeVar("T")

LISTENER_KEYS = ("name", "host", "port", "api_keys", "api_keys_env", "apis", "entries", "pools", "limits",
                 "user_limits", "keys")
POOL_KEYS = ("model", "replicas", "dns", "max_inflight", "policy", "cache_aware", "precise_prefix", "health",
             "breaker", "tokenizer", "api_key", "api_key_env", "timeout_s", "outputs", "queue_size")
ENTRY_KEYS = ("api", "signals", "projections", "decisions", "default", "algorithm", "signal_budget_s", "plugins")
ALGORITHM_KEYS = {"static": ("type",), "weighted": ("type", "weights"),
                  "escalate": ("type", "stages", "accept", "deadline_s", "max_calls", "judge")}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a second `small:` pool would silently win."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> object:
    try:
        return yaml.load(Path(path).read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"invalid YAML: {exc}"]) from exc


def load_config(path: Path, *, env: Mapping[str, str] | None = None) -> RouterConfig:
    """Read and validate a router YAML file."""
    return parse_config(read_yaml(path), str(path), env=env)


def parse_config(data: object, source: str = "<config>", *,
                 env: Mapping[str, str] | None = None) -> RouterConfig:
    """Build a RouterConfig from parsed YAML; raise ConfigError listing every problem.

    `env` (default: os.environ) supplies the variables named by `api_keys_env` / `api_key_env`.
    """
    f = Fields(os.environ if env is None else env)
    # pools and entries may be absent or empty: a router may serve System One alone.
    top = f.mapping("", data, ("listeners", "pools", "entries", "deployments", "store", "knowledge", "admission"),
                    required=("listeners",))
    admission = admission_reader.read_admission(f, top.get("admission", MISSING), "store" in top)
    listeners = f.items("listeners", top.get("listeners", MISSING),
                        lambda f, path, raw, i: _listener(f, path, raw, i, admission))
    _unique(f, "listeners", listeners, "port", "port")
    _unique(f, "listeners", listeners, "name", "listener name")
    raw_pools = f.named("pools", top.get("pools") or MISSING)
    pools = {name: _pool(f, f"pools.{name}", name, raw) for name, raw in raw_pools.items()}
    # ---- deployments: the model runtime's (config/deployments.py), with the pools' health and breaker ----
    deployments = read_deployments(f, top.get("deployments", MISSING), health=_health, breaker=_breaker)
    # ---- end of deployments ----
    # Deployments' names and `tasks` are read as they stand, so that a deployment broken elsewhere
    # still answers for the signals and stages that name it.
    raw_deployments = top.get("deployments", {})
    tasks = {name: [t for t in d["tasks"] if isinstance(t, str)] if isinstance(d, dict)
             and isinstance(d.get("tasks"), list) else None
             for name, d in (raw_deployments.items() if isinstance(raw_deployments, dict) else ())
             if isinstance(name, str)}  # other names are reported by read_deployments
    scope = systemone.Scope(pools, deployments, tuple(tasks))
    # ---- the plugins' store and knowledge bases (config/plugins_reader.py) ----
    store = plugins_reader.read_store(f, top["store"]) if "store" in top else None
    knowledge = plugins_reader.read_knowledge(f, top.get("knowledge", MISSING), tasks)
    reach = plugins_reader.Scope(tasks, plugins_reader.declared_knowledge(top.get("knowledge")))
    raw_entries = f.named("entries", top.get("entries") or MISSING)
    entries = {name: _entry(f, f"entries.{name}", name, raw, scope, reach) for name, raw in raw_entries.items()}
    plugins_reader.check_store(f, "store" in top, raw_entries)
    systemone.check_listeners(f, listeners, scope, {k: str(systemone.entry_api(v)) for k, v in raw_entries.items()})
    # Signals that name a deployment: it must be declared, and serve the signal's task.
    recipe.check_deployments(f, raw_entries, tasks)
    if f.errors:
        raise ConfigError(source, f.errors)
    return RouterConfig(tuple(_built(x) for x in listeners), {k: _built(v) for k, v in pools.items()},
                        {k: _built(v) for k, v in entries.items()}, source, deployments, store=store,
                        knowledge=knowledge, admission=admission)


def _listener(f: Fields, path: str, raw: object, i: int, admission: AdmissionConfig) -> ListenerConfig | None:
    m = f.mapping(path, raw, LISTENER_KEYS, required=("port",))
    d = defaults(ListenerConfig)
    name = f.string(f"{path}.name", m.get("name", f"listener-{i}"))
    host = f.string(f"{path}.host", m.get("host", d["host"]))
    port = f.integer(f"{path}.port", m.get("port"), 1, 65535)
    keys = (f.strings(f"{path}.api_keys", m["api_keys"], allow_empty=True) or ()) if "api_keys" in m else ()
    env_keys = f.env_list(f"{path}.api_keys_env", m["api_keys_env"]) if "api_keys_env" in m else ()
    apis = systemone.listener_apis(f, f"{path}.apis", m["apis"]) if "apis" in m else (d["apis"], d["systemone"])
    entries = f.strings(f"{path}.entries", m["entries"]) if "entries" in m else d["entries"]
    pools = f.strings(f"{path}.pools", m["pools"], allow_empty=True) if "pools" in m else d["pools"]
    api_keys = tuple(dict.fromkeys(keys + env_keys))
    limits, user_limits, settings = admission_reader.read_listener_admission(f, path, m, api_keys, admission)
    if name is None or host is None or port is None or apis is None or entries is None or pools is None or not m:
        return None
    return ListenerConfig(name, port, host, api_keys, apis[0], entries, apis[1], pools, limits, user_limits,
                          settings)


def _pool(f: Fields, path: str, name: str, raw: object) -> PoolConfig | None:
    m = f.mapping(path, raw, POOL_KEYS, required=("model",))
    if ("replicas" in m) == ("dns" in m) and m:
        f.add(path, "set exactly one of replicas, dns")
    replicas = f.items(f"{path}.replicas", m["replicas"], _replica) if "replicas" in m else []
    urls = [r.url if r else None for r in replicas]
    for i in rules.duplicates(urls):
        if urls[i] is not None:
            f.add(f"{path}.replicas[{i}].url", f"duplicate replica {urls[i]!r}")
    dns = _dns(f, f"{path}.dns", m["dns"]) if "dns" in m else None
    d = defaults(PoolConfig)
    policy = f.choice(f"{path}.policy", m.get("policy", d["policy"]), POLICIES, "policy", "policies")
    if "api_key" in m and "api_key_env" in m:
        f.add(path, "set at most one of api_key, api_key_env")
    api_key = f.optional(f"{path}.api_key", m.get("api_key"), f.string)
    if "api_key_env" in m:
        api_key = f.env_value(f"{path}.api_key_env", m["api_key_env"])
    if policy == "precise_prefix" and m:
        _precise_needs(f, path, m, replicas)
    # A value that failed its check falls back to the default: the config is refused anyway.
    return PoolConfig(
        name=name,
        model=f.string(f"{path}.model", m.get("model", MISSING)) or "",
        replicas=tuple(r for r in replicas if r),
        dns=dns,
        max_inflight=_or(f.integer(f"{path}.max_inflight", m.get("max_inflight", d["max_inflight"]), 1),
                         d["max_inflight"]),
        policy=_or(policy, d["policy"]),
        cache_aware=_cache_aware(f, f"{path}.cache_aware", m.get("cache_aware", {})),
        precise_prefix=_precise_prefix(f, f"{path}.precise_prefix", m.get("precise_prefix", {})),
        health=_health(f, f"{path}.health", m.get("health", {})),
        breaker=_breaker(f, f"{path}.breaker", m.get("breaker", {})),
        tokenizer=f.optional(f"{path}.tokenizer", m.get("tokenizer", d["tokenizer"]), f.string),
        api_key=api_key,
        timeout_s=_or(f.number(f"{path}.timeout_s", m.get("timeout_s", d["timeout_s"]), 0, open_low=True),
                      d["timeout_s"]),
        queue_size=_or(admission_reader.read_queue_size(f, f"{path}.queue_size", m.get("queue_size", d["queue_size"])),
                       d["queue_size"]),
        outputs=_or(systemone.pool_outputs(f, f"{path}.outputs", m["outputs"]) if "outputs" in m else None,
                    d["outputs"]),
    )


def _replica(f: Fields, path: str, raw: object, i: int) -> ReplicaConfig | None:
    m = f.mapping(path, raw, ("url", "grpc"), required=("url",))
    url = f.string(f"{path}.url", m.get("url", MISSING))
    grpc = f.optional(f"{path}.grpc", m.get("grpc"), f.string)
    grpc_ok = grpc is None or f.check(f"{path}.grpc", rules.grpc_address_problem(grpc))
    if url is None or "url" not in m or not f.check(f"{path}.url", rules.url_problem(url)) or not grpc_ok:
        return None
    return ReplicaConfig(url.rstrip("/"), grpc)


def _precise_needs(f: Fields, path: str, m: dict[str, Any], replicas: list[ReplicaConfig | None]) -> None:
    """What precise_prefix needs beyond the other policies: the model's tokenizer and chat template
    (`tokenizer`), and every replica's gRPC address, whose KvEvents say what its engines hold."""
    if "tokenizer" not in m:
        f.add(f"{path}.tokenizer", "required by policy precise_prefix: the checkpoint (a --model value) whose "
                                   "chat template and tokenizer the frontends use, to hash prompts as they do")
    dns = m.get("dns")
    if isinstance(dns, dict) and "grpc_port" not in dns:
        f.add(f"{path}.dns.grpc_port", "required by policy precise_prefix: the frontends' --grpc-port on each "
                                       "address the name resolves to, whose KvEvents stream it reads")
    raw = m.get("replicas")
    for i, replica in enumerate(replicas):
        if replica is not None and replica.grpc is None and isinstance(raw, list) and isinstance(raw[i], dict):
            f.add(f"{path}.replicas[{i}].grpc", "required by policy precise_prefix: host:port of the "
                                                "frontend's --grpc-port, whose KvEvents stream it reads")


def _dns(f: Fields, path: str, raw: object) -> DnsConfig | None:
    m = f.mapping(path, raw, ("name", "port", "scheme", "refresh_s", "grpc_port"), required=("name",))
    d = defaults(DnsConfig)
    grpc_port = f.integer(f"{path}.grpc_port", m["grpc_port"], 1, 65535) if "grpc_port" in m else None
    return DnsConfig(
        name=f.string(f"{path}.name", m.get("name", MISSING)) or "",
        port=_or(f.integer(f"{path}.port", m.get("port", d["port"]), 1, 65535), d["port"]),
        scheme=_or(f.choice(f"{path}.scheme", m.get("scheme", d["scheme"]), ("http", "https"), "scheme"),
                   d["scheme"]),
        refresh_s=_or(f.number(f"{path}.refresh_s", m.get("refresh_s", d["refresh_s"]), 0, open_low=True),
                      d["refresh_s"]),
        grpc_port=grpc_port)


def _balance(f: Fields, path: str, m: Mapping[str, Any], d: Mapping[str, Any]) -> dict[str, Any]:
    """The keys both prefix policies take: the match threshold and the load-imbalance fallback's."""
    return {
        "cache_threshold": _or(f.number(f"{path}.cache_threshold", m.get("cache_threshold", d["cache_threshold"]),
                                        0, 1), d["cache_threshold"]),
        "balance_abs": _or(f.integer(f"{path}.balance_abs", m.get("balance_abs", d["balance_abs"]), 0),
                           d["balance_abs"]),
        "balance_rel": _or(f.number(f"{path}.balance_rel", m.get("balance_rel", d["balance_rel"]), 1),
                           d["balance_rel"])}


def _cache_aware(f: Fields, path: str, raw: object) -> CacheAwareConfig:
    d = defaults(CacheAwareConfig)
    m = f.mapping(path, raw, tuple(d))
    return CacheAwareConfig(
        **_balance(f, path, m, d),
        max_tree_chars=_or(f.integer(f"{path}.max_tree_chars", m.get("max_tree_chars", d["max_tree_chars"]), 1),
                           d["max_tree_chars"]),
        eviction_s=_or(f.number(f"{path}.eviction_s", m.get("eviction_s", d["eviction_s"]), 0, open_low=True),
                       d["eviction_s"]))


def _precise_prefix(f: Fields, path: str, raw: object) -> PrecisePrefixConfig:
    d = defaults(PrecisePrefixConfig)
    m = f.mapping(path, raw, tuple(d))
    return PrecisePrefixConfig(
        **_balance(f, path, m, d),
        pending_s=_or(f.number(f"{path}.pending_s", m.get("pending_s", d["pending_s"]), 0), d["pending_s"]),
        reconnect_max_s=_or(f.number(f"{path}.reconnect_max_s", m.get("reconnect_max_s", d["reconnect_max_s"]),
                                     0, open_low=True), d["reconnect_max_s"]))


def _health(f: Fields, path: str, raw: object) -> HealthConfig:
    m = f.mapping(path, raw, ("path", "interval_s", "timeout_s", "failures"))
    d = defaults(HealthConfig)
    probe = f.string(f"{path}.path", m.get("path", d["path"]))
    if probe is not None and not probe.startswith("/"):
        f.add(f"{path}.path", f"expected a path starting with '/', got {probe!r}")
    return HealthConfig(
        path=probe or d["path"],
        interval_s=_or(f.number(f"{path}.interval_s", m.get("interval_s", d["interval_s"]), 0, open_low=True),
                       d["interval_s"]),
        timeout_s=_or(f.number(f"{path}.timeout_s", m.get("timeout_s", d["timeout_s"]), 0, open_low=True),
                      d["timeout_s"]),
        failures=_or(f.integer(f"{path}.failures", m.get("failures", d["failures"]), 1), d["failures"]))


def _breaker(f: Fields, path: str, raw: object) -> BreakerConfig:
    m = f.mapping(path, raw, ("failures", "cooldown_s"))
    d = defaults(BreakerConfig)
    return BreakerConfig(
        failures=_or(f.integer(f"{path}.failures", m.get("failures", d["failures"]), 1), d["failures"]),
        cooldown_s=_or(f.number(f"{path}.cooldown_s", m.get("cooldown_s", d["cooldown_s"]), 0, open_low=True),
                       d["cooldown_s"]))


def _band_names(raw: object) -> tuple[str, ...]:
    """The names in a broken projection's `bands`, as far as they can be read (its errors are reported
    where it is read: here it only answers for the decisions that name it)."""
    bands = raw if isinstance(raw, list) else ()
    return tuple(b["name"] for b in bands if isinstance(b, dict) and isinstance(b.get("name"), str))


def _entry(f: Fields, path: str, name: str, raw: object, scope: systemone.Scope,
           reach: plugins_reader.Scope) -> EntryConfig | None:
    api = systemone.read_entry_api(f, path, raw)
    if api is None:
        return None
    native = api == "systemone"  # a System One recipe: its candidates are deployments (config/systemone.py)
    if native:
        raw = plugins_reader.refuse_on_native(f, path, raw)
    keys = systemone.NATIVE_ENTRY_KEYS if native else ENTRY_KEYS
    m = f.mapping(path, raw if native else systemone.refuse_budget(f, path, raw), keys, required=("default",))
    d = defaults(EntryConfig)
    signals = f.items(f"{path}.signals", m.get("signals", list(d["signals"])), recipe.signal, allow_empty=True)
    names = [s.name if s else None for s in signals]
    for i in rules.duplicates(names):
        if names[i] is not None:
            f.add(f"{path}.signals[{i}].name", f"duplicate signal {names[i]!r}")
    by_name: dict[str, Signal | None] = {n: s for n, s in zip(names, signals, strict=True) if n is not None}
    raw_signals = m.get("signals")
    if isinstance(raw_signals, list):  # a broken signal still defines its name for references
        by_name.update({s["name"]: None for s in raw_signals
                        if isinstance(s, dict) and isinstance(s.get("name"), str) and s["name"] not in by_name})
    known = tuple(by_name)
    projections = recipe.projections(f, f"{path}.projections", m.get("projections", MISSING), by_name)
    projected = {p.name: tuple(b.name for b in p.bands) for p in projections}
    raw_projections = m.get("projections")
    if isinstance(raw_projections, list):  # as with signals: a broken projection's name still resolves
        projected.update({p["name"]: _band_names(p.get("bands")) for p in raw_projections
                          if isinstance(p, dict) and isinstance(p.get("name"), str) and p["name"] not in projected})

    pools = tuple(scope.pools)

    def decision(f: Fields, p: str, raw: object, i: int) -> DecisionRule | None:
        r = f.mapping(p, systemone.refuse_budget(f, p, raw), ("name", "when", "pools", "plugins"),
                      required=("when", "pools"))
        rule_name = f.string(f"{p}.name", r.get("name", f"decision-{i}"))
        when = recipe.expr(f, f"{p}.when", r["when"], known, projected) if "when" in r else None
        targets = _pool_list(f, f"{p}.pools", r.get("pools", MISSING), pools)
        # absent: the entry's list runs; [] runs none
        hooks = plugins_reader.read_plugins(f, f"{p}.plugins", r["plugins"], reach) if "plugins" in r else None
        if "plugins" in r and hooks is None:
            return None
        return DecisionRule(rule_name, when, targets, plugins=hooks) if rule_name and when and targets else None

    budget = systemone.budget(f, f"{path}.budget", m.get("budget", MISSING)) if native else None
    read = systemone.decision_reader(scope, known, projected, budget) if native else decision
    decisions = f.items(f"{path}.decisions", m.get("decisions", list(d["decisions"])), read, allow_empty=True)
    rule_names = [r.name if r else None for r in decisions]
    for i in rules.duplicates(rule_names):
        if rule_names[i] is not None:
            f.add(f"{path}.decisions[{i}].name", f"duplicate decision {rule_names[i]!r}")
    algorithm: Algorithm | NativeEscalateAlgorithm | None
    if native:
        default = systemone.stages(f, f"{path}.default", m.get("default", MISSING), scope)
        systemone.check_family(f, path, default, decisions, scope)
        algorithm = systemone.native_algorithm(f, f"{path}.algorithm", m.get("algorithm", {}), scope)
    else:
        default = _pool_list(f, f"{path}.default", m.get("default", MISSING), pools)
        algorithm = _algorithm(f, f"{path}.algorithm", m.get("algorithm", {"type": d["algorithm"].type}), scope)
    signal_budget = f.number(f"{path}.signal_budget_s", m.get("signal_budget_s", d["signal_budget_s"]), 0, 60,
                             open_low=True)
    hooks = plugins_reader.read_plugins(f, f"{path}.plugins", m["plugins"], reach) if "plugins" in m else ()
    if not m or default is None or algorithm is None or signal_budget is None or (native and budget is None):
        return None
    if hooks is None:
        return None
    entry = EntryConfig(name, default, tuple(s for s in signals if s), tuple(r for r in decisions if r),
                        algorithm, projections, signal_budget, api, budget, plugins=hooks)
    if native:
        systemone.check_calls(f, path, entry)
    return entry


def _pool_list(f: Fields, path: str, raw: object, pools: tuple[str, ...]) -> tuple[str, ...] | None:
    names = f.strings(path, raw)
    ok = names is not None
    for i, name in enumerate(names or ()):
        ok = f.check(f"{path}[{i}]", rules.unknown_name(name, pools, "pool")) and ok
    return names if ok else None


def _algorithm(f: Fields, path: str, raw: object, scope: systemone.Scope) -> Algorithm | None:
    pools = tuple(scope.pools)
    if not isinstance(raw, dict):
        f.mapping(path, raw, ())
        return None
    if raw.get("type") == "cache_aware":
        f.add(f"{path}.type", "cache_aware chooses a replica inside a pool, not a pool: set `policy: "
                              "cache_aware` on the pools (pools.<name>.policy) and keep this static")
        return None
    kind = f.choice(f"{path}.type", raw.get("type", StaticAlgorithm.type), tuple(ALGORITHM_TYPES), "algorithm type")
    if kind is None:
        return None
    m = f.mapping(path, raw, ALGORITHM_KEYS[kind], required={"weighted": ("weights",),
                                                             "escalate": ("stages",)}.get(kind, ()))
    if kind == "static":
        return StaticAlgorithm()
    if kind == "weighted":
        weights = f.named(f"{path}.weights", m.get("weights", MISSING))
        ok = bool(weights)
        for pool, w in weights.items():
            ok = f.check(f"{path}.weights.{pool}", rules.unknown_name(pool, pools, "pool")) and ok
            ok = f.number(f"{path}.weights.{pool}", w, 0, open_low=True) is not None and ok
        return WeightedAlgorithm({k: float(v) for k, v in weights.items()}) if ok else None
    stages = _pool_list(f, f"{path}.stages", m.get("stages", MISSING), pools)
    if stages is not None and len(stages) < 2:
        f.add(f"{path}.stages", f"expected at least 2 pools, got {len(stages)}")
    d = defaults(EscalateAlgorithm)
    accept = _accept(f, f"{path}.accept", m.get("accept", {}))
    deadline = f.number(f"{path}.deadline_s", m.get("deadline_s", d["deadline_s"]), 0, open_low=True)
    calls = f.integer(f"{path}.max_calls", m.get("max_calls", d["max_calls"]), 1)
    judge = systemone.judge(f, f"{path}.judge", m["judge"], scope) if "judge" in m else None
    if stages and len(stages) >= 2 and accept and deadline and calls and (judge or "judge" not in m):
        return EscalateAlgorithm(stages, accept, deadline, calls, judge)
    return None


def _accept(f: Fields, path: str, raw: object) -> AcceptConfig | None:
    m = f.mapping(path, raw, ("finish_reasons", "min_chars", "regex"))
    d = defaults(AcceptConfig)
    reasons = f.strings(f"{path}.finish_reasons", m.get("finish_reasons", list(d["finish_reasons"])))
    for i, reason in enumerate(reasons or ()):
        f.check(f"{path}.finish_reasons[{i}]", rules.unknown_name(reason, FINISH_REASONS, "finish reason"))
    chars = f.integer(f"{path}.min_chars", m.get("min_chars", d["min_chars"]), 0)
    regex = f.optional(f"{path}.regex", m.get("regex", d["regex"]), f.string)
    if regex is not None:
        f.check(f"{path}.regex", rules.regex_problem(regex))
    if reasons is None or chars is None or any(r not in FINISH_REASONS for r in reasons):
        return None
    if regex is not None and rules.regex_problem(regex):
        return None
    return AcceptConfig(reasons, chars, regex)


def _unique(f: Fields, path: str, items: list[Any], attr: str, what: str) -> None:
    values = [getattr(x, attr) if x else None for x in items]
    for i in rules.duplicates(values):
        if values[i] is not None:
            f.add(f"{path}[{i}].{attr}", f"duplicate {what} {values[i]!r}")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _built(item: T | None) -> T:
    """An item of a config without errors: a builder returns None only along with an error."""
    assert item is not None
    return item

