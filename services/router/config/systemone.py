"""Readers of the router config's System One keys: a listener's apis mapping and published models and
pools, native recipes (entries with `api: systemone`: stages, budget, confidence acceptance, judge) and
pools' outputs. Run once by the router process at start, from the loader; problems go to `Fields`."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.router.config import recipe, rules
from services.router.config.budget import OUTPUTS, Budget, ConfidenceAccept, JudgeConfig, NativeEscalateAlgorithm
from services.router.config.fields import MISSING, Fields, defaults, show
from services.router.config.types import (
    APIS,
    ENTRY_APIS,
    DecisionRule,
    DeploymentConfig,
    EntryConfig,
    ListenerConfig,
    PoolConfig,
)

NATIVE_ENTRY_KEYS = ("api", "signals", "projections", "decisions", "default", "algorithm", "budget",
                     "signal_budget_s")
# The apis that serve a published chat pool: a request naming it goes straight to it.
POOL_APIS = ("chat", "completions", "responses", "messages", "images")
APIS_EXAMPLE = "{chat: {}, models: {}, systemone: {models: [NAME, ...]}}"
# Keys of a chat escalate that a native recipe spells elsewhere: said, rather than "unknown key".
_NATIVE_ALGORITHM_MOVED = {
    "stages": "a native recipe's stages are its decisions' `stages` and its `default`",
    "deadline_s": "a native recipe's deadline is the entry's `budget.deadline_s`",
    "max_calls": "a native recipe's call cap is the entry's `budget.max_calls`",
}


@dataclass(frozen=True, slots=True)
class Scope:
    """What a recipe's names may refer to, read before the entries."""

    pools: Mapping[str, PoolConfig | None]  # chat pools, in file order (None: too broken to say)
    deployments: Mapping[str, DeploymentConfig]  # the deployments that parsed
    declared: tuple[str, ...]  # every declared deployment's name, broken ones included

    @property
    def text_pools(self) -> tuple[str, ...]:
        return tuple(name for name, pool in self.pools.items() if pool is None or "text" in pool.outputs)


# ---- listeners ----

def listener_apis(f: Fields, path: str, raw: object) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """`listeners[].apis`: a list of api names, or a mapping api -> options (only systemone takes any:
    `{models: [NAME, ...]}`). Returns (the api names, the System One models published)."""
    if isinstance(raw, list):
        names = f.strings(path, raw)
        # `decisions` named the explain route before /v1/decisions became the System One API's alias.
        names = tuple("explain" if api == "decisions" else api for api in names) if names is not None else None
        ok = names is not None
        for j, api in enumerate(names or ()):
            if api == "systemone":
                f.add(f"{path}[{j}]", f"systemone is published with its models: write apis as a mapping, "
                                      f"e.g. {APIS_EXAMPLE}")
                ok = False
            else:
                ok = f.check(f"{path}[{j}]", rules.unknown_name(api, APIS, "api")) and ok
        return (names, ()) if ok and names is not None else None
    if not isinstance(raw, dict) or not raw:
        f.add(path, f"expected a non-empty list of apis, or a mapping such as {APIS_EXAMPLE}; got "
                    f"{'an empty mapping' if raw == {} else show(raw)}")
        return None
    named = f.named(path, raw)
    ok, models = len(named) == len(raw), tuple[str, ...]()
    for api, options in named.items():
        where = f"{path}.{api}"
        if api == "decisions":
            f.add(where, "ambiguous: write `explain` for the routing preview (POST /v1/router/explain), or "
                         "`systemone` for the System One API (POST /v1/decisions is its alias)")
            ok = False
        elif not f.check(where, rules.unknown_name(api, APIS, "api")):
            ok = False
        elif api == "systemone":
            published = _systemone_options(f, where, options)
            ok, models = ok and published is not None, published or ()
        elif options not in (None, {}):
            f.add(where, f"{api} takes no options: write `{api}: {{}}` (only systemone has options: "
                         f"{{models: [NAME, ...]}})")
            ok = False
    return (tuple(named), models) if ok else None


def _systemone_options(f: Fields, path: str, raw: object) -> tuple[str, ...] | None:
    if not isinstance(raw, dict):
        f.add(path, f"expected {{models: [NAME, ...]}}, the deployments and native entries (api: systemone) "
                    f"this listener publishes; got {show(raw)}")
        return None
    m = f.mapping(path, raw, ("models",), required=("models",))
    models = f.strings(f"{path}.models", m.get("models", MISSING))
    repeated = rules.duplicates(list(models or ()))
    for j in repeated:
        f.add(f"{path}.models[{j}]", f"duplicate model {(models or ())[j]!r}")
    return models if not repeated else None


def check_listeners(f: Fields, listeners: Sequence[ListenerConfig | None], scope: Scope,
                    entry_apis: Mapping[str, str]) -> None:
    """Each listener's chat entries, published System One models and published pools name what exists,
    and mean one thing each. `entry_apis`: every entry's api as written (chat or systemone)."""
    chat = tuple(name for name, api in entry_apis.items() if api == "chat")
    native = tuple(name for name, api in entry_apis.items() if api == "systemone")
    broken = tuple(name for name, api in entry_apis.items() if api not in ENTRY_APIS)  # said where read
    for i, listener in enumerate(listeners):
        if listener is None:
            continue
        path = f"listeners[{i}]"
        for j, entry in enumerate(listener.entries):
            if entry in broken:
                continue
            if entry in native:
                f.add(f"{path}.entries[{j}]", f"{entry!r} is a native System One recipe (api: systemone), not a "
                                              f"chat model: publish it under apis.systemone.models")
            else:
                f.check(f"{path}.entries[{j}]", rules.unknown_name(entry, chat, "entry", "entries"))
        for j, model in enumerate(listener.systemone):
            if model not in broken:
                f.check(f"{path}.apis.systemone.models[{j}]", _published_problem(model, scope, chat, native))
        _check_pools(f, path, listener, scope, listener.entries or chat)


def _published_problem(model: str, scope: Scope, chat: tuple[str, ...], native: tuple[str, ...]) -> str | None:
    if model in scope.declared and model in native:
        return f"{model!r} is both a deployment and a native entry: rename one"
    if model in scope.declared or model in native:
        return None
    if model in chat:
        return (f"{model!r} is a chat entry; System One publishes deployments and native entries (api: "
                f"systemone)")
    return (f"unknown System One model {model!r} (deployments: {', '.join(scope.declared) or 'none defined'}; "
            f"native entries: {', '.join(native) or 'none defined'})")


def _check_pools(f: Fields, path: str, listener: ListenerConfig, scope: Scope, served: tuple[str, ...]) -> None:
    for j in rules.duplicates(list(listener.pools)):
        f.add(f"{path}.pools[{j}]", f"duplicate pool {listener.pools[j]!r}")
    for j, pool in enumerate(listener.pools):
        if not f.check(f"{path}.pools[{j}]", rules.unknown_name(pool, tuple(scope.pools), "pool")):
            continue
        if pool in served:
            f.add(f"{path}.pools[{j}]", f"{pool!r} is also a chat entry served on this listener (one name, two "
                                        f"meanings): rename one, or leave it out of this listener's entries")
    if listener.pools and not set(POOL_APIS) & set(listener.apis):
        f.add(f"{path}.pools", f"nothing would serve them: published pools are served by the "
                               f"{', '.join(POOL_APIS)} apis, and this listener has none "
                               f"(apis: {', '.join(listener.apis)})")


# ---- pools ----

def pool_outputs(f: Fields, path: str, raw: object) -> tuple[str, ...] | None:
    """`pools.X.outputs`: what the pool produces, a non-empty list of OUTPUTS (text, image)."""
    outputs = f.strings(path, raw)
    ok = outputs is not None
    for j, output in enumerate(outputs or ()):
        ok = f.check(f"{path}[{j}]", rules.unknown_name(output, OUTPUTS, "output")) and ok
    return tuple(dict.fromkeys(outputs)) if ok and outputs is not None else None


# ---- entries ----

def entry_api(raw: object) -> object:
    """An entry's `api` as written (chat when absent), before it is checked."""
    return raw.get("api", "chat") if isinstance(raw, dict) else "chat"


def read_entry_api(f: Fields, path: str, raw: object) -> str | None:
    return f.choice(f"{path}.api", entry_api(raw), ENTRY_APIS, "api")


def refuse_budget(f: Fields, path: str, raw: object) -> object:
    """A chat entry or chat decision without its `budget` key, refused here with why (not as unknown)."""
    if not isinstance(raw, dict) or "budget" not in raw:
        return raw
    f.add(f"{path}.budget", "only for api: systemone entries (a chat escalate's deadline and call cap are "
                            "algorithm.deadline_s and algorithm.max_calls)")
    return {k: v for k, v in raw.items() if k != "budget"}


def budget(f: Fields, path: str, raw: object, bound: Budget | None = None) -> Budget | None:
    """An entry's `budget: {deadline_s, max_calls}` (defaults from Budget), or, with `bound` (the
    entry's), a decision's, which may only tighten it: a value left out is the entry's."""
    m = f.mapping(path, raw, ("deadline_s", "max_calls"))
    d = defaults(Budget) if bound is None else {"deadline_s": bound.deadline_s, "max_calls": bound.max_calls}
    deadline = f.number(f"{path}.deadline_s", m.get("deadline_s", d["deadline_s"]), 0, open_low=True)
    calls = f.integer(f"{path}.max_calls", m.get("max_calls", d["max_calls"]), 1)
    if bound is not None and deadline is not None and deadline > bound.deadline_s:
        f.add(f"{path}.deadline_s", f"a decision's budget may only tighten the entry's: {deadline:g} > the "
                                    f"entry's budget.deadline_s {bound.deadline_s:g}")
        deadline = None
    if bound is not None and calls is not None and calls > bound.max_calls:
        f.add(f"{path}.max_calls", f"a decision's budget may only tighten the entry's: {calls} > the entry's "
                                   f"budget.max_calls {bound.max_calls}")
        calls = None
    if deadline is None or calls is None or (raw is not MISSING and not isinstance(raw, dict)):
        return None
    return Budget(deadline, calls)


DecisionReader = Callable[[Fields, str, Any, int], DecisionRule | None]


def decision_reader(scope: Scope, signals: tuple[str, ...], projected: Mapping[str, tuple[str, ...]],
                    bound: Budget | None) -> DecisionReader:
    """The reader of a native entry's decisions: `{name, when, stages, budget}`; `bound` is the entry's
    budget (None: broken, its errors reported)."""

    def decision(f: Fields, path: str, raw: object, i: int) -> DecisionRule | None:
        if isinstance(raw, dict) and "pools" in raw:
            f.add(f"{path}.pools", "a native recipe's candidates are deployments, its escalate stages: write "
                                   "`stages: [DEPLOYMENT, ...]`, the fast one first")
            raw = {k: v for k, v in raw.items() if k != "pools"}
            if "stages" not in raw:
                raw["stages"] = MISSING  # said above: not "required" again
        r = f.mapping(path, raw, ("name", "when", "stages", "budget"), required=("when", "stages"))
        name = f.string(f"{path}.name", r.get("name", f"decision-{i}"))
        when = recipe.expr(f, f"{path}.when", r["when"], signals, projected) if "when" in r else None
        targets = stages(f, f"{path}.stages", r.get("stages", MISSING), scope)
        tightened = budget(f, f"{path}.budget", r["budget"], bound) if "budget" in r and bound else None
        if not (name and when and targets) or ("budget" in r and tightened is None):
            return None
        return DecisionRule(name, when, targets, tightened)

    return decision


def stages(f: Fields, path: str, raw: object, scope: Scope) -> tuple[str, ...] | None:
    """A native recipe's stages: declared deployments, the fast one first."""
    found = f.strings(path, raw)
    ok = found is not None
    for j, name in enumerate(found or ()):
        ok = f.check(f"{path}[{j}]", rules.unknown_name(name, scope.declared, "deployment")) and ok
    named = list(found or ())
    for j in rules.duplicates(named):
        ok = f.check(f"{path}[{j}]", f"duplicate stage {named[j]!r}: a stage is asked once "
                                     "(a model answers the same input the same way)") and ok
    return found if ok else None


def check_calls(f: Fields, path: str, entry: EntryConfig) -> None:
    """Every call cap of a native recipe leaves room for a stage call after its signals: those are
    evaluated first, one call per deployment they ask, and count against the same cap."""
    by_name = {s.name: s for s in entry.signals}
    asked = {d for name in entry.needed if (d := getattr(by_name.get(name), "deployment", None)) is not None}
    caps = [(f"{path}.budget.max_calls", entry.budget.max_calls if entry.budget else None)]
    caps += [(f"{path}.decisions[{i}].budget.max_calls", rule.budget.max_calls if rule.budget else None)
             for i, rule in enumerate(entry.decisions)]
    for at, cap in caps:
        if cap is not None and cap <= len(asked):
            f.add(at, f"{cap} leaves no stage call: the signals ask {len(asked)} deployment(s) "
                      f"({', '.join(sorted(asked))}) first, and each call counts against it")


def check_family(f: Fields, path: str, default: tuple[str, ...] | None,
                 decisions: Sequence[DecisionRule | None], scope: Scope) -> None:
    """Every stage of a native recipe is of one family, classifier or cross_encoder: its answers are
    compared by their confidence (a deployment too broken to say is left out)."""
    where = [(f"{path}.decisions[{i}].stages[{j}]", stage) for i, rule in enumerate(decisions) if rule
             for j, stage in enumerate(rule.pools)]
    where += [(f"{path}.default[{j}]", stage) for j, stage in enumerate(default or ())]
    first: tuple[str, str, str] | None = None  # (path, stage, family) of the first stage that parsed
    for at, stage in where:
        deployment = scope.deployments.get(stage)
        if deployment is None:
            continue
        family = deployment.family
        if family == "embedding":
            f.add(at, f"deployment {stage!r} is an embedding model: it has no confidence to escalate on; a "
                      f"native recipe's stages are classifiers or cross-encoders")
        elif first is None:
            first = (at, stage, family)
        elif family != first[2]:
            f.add(at, f"deployment {stage!r} is a {family}, but {first[1]!r} ({first[0]}) is a {first[2]}: "
                      f"a native recipe's stages are all of one family")


def native_algorithm(f: Fields, path: str, raw: object, scope: Scope) -> NativeEscalateAlgorithm | None:
    """A native recipe's `algorithm`: `{type: escalate, accept, judge}` (type is escalate, the default)."""
    if not isinstance(raw, dict):
        f.mapping(path, raw, ())
        return None
    kind = raw.get("type", NativeEscalateAlgorithm.type)
    if kind != NativeEscalateAlgorithm.type:
        f.add(f"{path}.type", f"a native recipe escalates over its stages: expected escalate (or leave type "
                              f"out), got {show(kind)}")
    for key, where in _NATIVE_ALGORITHM_MOVED.items():
        if key in raw:
            f.add(f"{path}.{key}", f"not here: {where}")
    m = f.mapping(path, {k: v for k, v in raw.items() if k not in _NATIVE_ALGORITHM_MOVED},
                  ("type", "accept", "judge"))
    accept = confidence_accept(f, f"{path}.accept", m.get("accept", {}))
    chosen = judge(f, f"{path}.judge", m["judge"], scope) if "judge" in m else None
    if accept is None or ("judge" in m and chosen is None) or kind != NativeEscalateAlgorithm.type:
        return None
    if any(key in raw for key in _NATIVE_ALGORITHM_MOVED):
        return None
    return NativeEscalateAlgorithm(accept, chosen)


def confidence_accept(f: Fields, path: str, raw: object) -> ConfidenceAccept | None:
    m = f.mapping(path, raw, ("min_probability", "min_margin"))
    d = defaults(ConfidenceAccept)
    low = f.number(f"{path}.min_probability", m.get("min_probability", d["min_probability"]), 0, 1)
    margin = f.number(f"{path}.min_margin", m.get("min_margin", d["min_margin"]), 0, 1)
    if low is None or margin is None or not isinstance(raw, dict):
        return None
    return ConfidenceAccept(low, margin)


def judge(f: Fields, path: str, raw: object, scope: Scope) -> JudgeConfig | None:
    """Either escalate's `judge: {pool, timeout_s, max_calls}`: a chat pool with text output."""
    m = f.mapping(path, raw, ("pool", "timeout_s", "max_calls"), required=("pool",))
    pool = f.string(f"{path}.pool", m.get("pool", MISSING))
    ok = pool is not None and f.check(f"{path}.pool", rules.unknown_name(pool, tuple(scope.pools), "pool"))
    found = scope.pools.get(pool) if ok and pool is not None else None
    outputs = found.outputs if found is not None else ("text",)  # unknown, or too broken to say: said elsewhere
    if "text" not in outputs:
        f.add(f"{path}.pool", f"pool {pool!r} has outputs {', '.join(outputs)}; a judge is a chat pool with text "
                              f"output (pools with it: {', '.join(scope.text_pools) or 'none defined'})")
        ok = False
    timeout = f.number(f"{path}.timeout_s", m.get("timeout_s", defaults(JudgeConfig)["timeout_s"]), 0,
                       open_low=True)
    calls = f.integer(f"{path}.max_calls", m.get("max_calls", defaults(JudgeConfig)["max_calls"]), 1)
    if not ok or pool is None or timeout is None or calls is None:
        return None
    return JudgeConfig(pool, timeout, calls)
