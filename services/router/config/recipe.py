"""Readers for the parts of an entry's recipe that name signals: the signals themselves, projections
(weighted sums of signal values, cut into named bands), decision expressions, and the check that each
model-backed signal names a deployment that serves its task. Run once by the router process at start,
from the loader; problems go to `Fields` with their key paths."""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from services.router.config import rules
from services.router.config.fields import MISSING, Fields, defaults
from services.router.config.types import (
    MODEL_SIGNAL_TYPES,
    REGEX_FLAGS,
    SIGNAL_TYPES,
    AllOf,
    AnyOf,
    Band,
    ClassifierSignal,
    ContextLengthSignal,
    DomainSignal,
    EmbeddingSignal,
    Expr,
    KeywordSignal,
    Not,
    Projection,
    ProjectionInput,
    ProjectionRef,
    RegexSignal,
    RerankSignal,
    Signal,
    SignalRef,
)

SIGNAL_KEYS = {"keyword": ("name", "type", "keywords", "mode", "case_sensitive"),
               "regex": ("name", "type", "pattern", "flags"),
               "context_length": ("name", "type", "min_tokens", "max_tokens"),
               "embedding": ("name", "type", "examples", "threshold", "deployment"),
               "classifier": ("name", "type", "deployment", "labels", "threshold"),
               "domain": ("name", "type", "domains", "threshold", "deployment", "examples"),
               "rerank": ("name", "type", "deployment", "examples", "threshold")}
REQUIRED_KEYS = {"keyword": ("keywords",), "regex": ("pattern",), "embedding": ("examples",),
                 "classifier": ("deployment", "labels"), "domain": ("domains",),
                 "rerank": ("deployment", "examples")}
# The deployment tasks (deployments.<name>.tasks) that can answer each signal: a cross-encoder
# deployment serves rerank calls whether it declares `rerank` or `score`.
SIGNAL_TASKS = {"embedding": ("embed",), "classifier": ("classify",), "rerank": ("rerank", "score")}
OPERATORS = ("any", "all", "not")
VALUES = ("matched", "score")


def signal(f: Fields, path: str, raw: object, i: int) -> Signal | None:
    if not isinstance(raw, dict):
        f.mapping(path, raw, ())
        return None
    kind = f.choice(f"{path}.type", raw.get("type"), tuple(SIGNAL_TYPES), "signal type")
    if kind is None:
        return None
    m = f.mapping(path, raw, SIGNAL_KEYS[kind], required=("name",) + REQUIRED_KEYS.get(kind, ()))
    name = f.string(f"{path}.name", m.get("name", MISSING))
    d = defaults(SIGNAL_TYPES[kind])
    if kind == "keyword":
        words = f.strings(f"{path}.keywords", m.get("keywords", MISSING))
        mode = f.choice(f"{path}.mode", m.get("mode", d["mode"]), ("any", "all"), "mode")
        case = f.boolean(f"{path}.case_sensitive", m.get("case_sensitive", d["case_sensitive"]))
        return KeywordSignal(name, words, mode, case) if name and words and mode and case is not None else None
    if kind == "regex":
        return _regex(f, path, m, name, d)
    if kind == "context_length":
        low = f.integer(f"{path}.min_tokens", m.get("min_tokens", d["min_tokens"]), 0)
        high = f.optional(f"{path}.max_tokens", m.get("max_tokens", d["max_tokens"]), lambda p, v: f.integer(p, v, 1))
        if low is not None and high is not None and high <= low:
            f.add(f"{path}.max_tokens", f"expected more than min_tokens ({low}), got {high}")
        return ContextLengthSignal(name, low, high) if name and low is not None else None
    threshold = f.number(f"{path}.threshold", m.get("threshold", d["threshold"]), 0, 1)
    deployment = f.string(f"{path}.deployment", m["deployment"]) if "deployment" in m else None
    if kind == "domain":
        return _domain(f, path, m, name, threshold, deployment)
    texts = f.strings(f"{path}.{'labels' if kind == 'classifier' else 'examples'}",
                      m.get("labels" if kind == "classifier" else "examples", MISSING))
    if not (name and texts and threshold is not None) or ("deployment" in m and deployment is None):
        return None
    if kind == "embedding":
        return EmbeddingSignal(name, texts, threshold, deployment)
    if deployment is None:
        return None
    return ClassifierSignal(name, deployment, texts, threshold) if kind == "classifier" else RerankSignal(
        name, deployment, texts, threshold)


def _regex(f: Fields, path: str, m: dict[str, Any], name: str | None, d: Mapping[str, Any]) -> RegexSignal | None:
    flags = f.strings(f"{path}.flags", m.get("flags", list(d["flags"])), allow_empty=True)
    for j, flag in enumerate(flags or ()):
        f.check(f"{path}.flags[{j}]", rules.unknown_name(flag, tuple(REGEX_FLAGS), "flag"))
    pattern = f.string(f"{path}.pattern", m.get("pattern", MISSING))
    if pattern is not None and "pattern" in m:
        f.check(f"{path}.pattern", rules.regex_problem(pattern, flags or ()))
    if (name and pattern and flags is not None and not rules.regex_problem(pattern, flags)
            and all(flag in REGEX_FLAGS for flag in flags)):
        return RegexSignal(name, pattern, flags)
    return None


def _domain(f: Fields, path: str, m: dict[str, Any], name: str | None, threshold: float | None,
            deployment: str | None) -> DomainSignal | None:
    """By a classifier (`deployment`, a classify one), or by labelled `examples` (then `deployment`,
    optional, is an embed one): without either there is nothing to tell the domain by."""
    domains = f.strings(f"{path}.domains", m.get("domains", MISSING))
    examples: list[tuple[str, tuple[str, ...]]] = []
    named: dict[str, Any] = {}
    if "examples" in m:
        named = f.named(f"{path}.examples", m["examples"])
        for label, texts in named.items():
            parsed = f.strings(f"{path}.examples.{label}", texts)
            if parsed is not None:
                examples.append((label, parsed))
        labels = list(named)
        for j, domain in enumerate(domains or ()):
            f.check(f"{path}.domains[{j}]", rules.unknown_name(domain, labels, "domain",
                                                               "labels of examples"))
    elif "deployment" not in m:
        f.add(f"{path}.deployment", "required: a classify deployment, or `examples` ({label: [texts]}) "
                                    "to tell the domain by similarity")
    if not (name and domains and threshold is not None) or ("deployment" in m and deployment is None):
        return None
    if ("examples" in m and len(examples) < len(named)) or (deployment is None and not examples):
        return None
    return DomainSignal(name, domains, threshold, deployment, tuple(examples))


def check_deployments(f: Fields, raw_entries: Mapping[str, Any],
                      tasks: Mapping[str, Collection[str] | None]) -> None:
    """Every signal's `deployment` is declared under `deployments:` and serves what the signal asks.

    Read from the raw entries so that each error names the signal's own index; `tasks` is each
    declared deployment's `tasks` (None: a deployment too broken to say, its own errors reported)."""
    for entry_name, entry in raw_entries.items():
        raw_signals = entry.get("signals") if isinstance(entry, dict) else None
        for i, raw in enumerate(raw_signals if isinstance(raw_signals, list) else ()):
            if not isinstance(raw, dict) or not isinstance(raw.get("deployment"), str):
                continue
            path, name = f"entries.{entry_name}.signals[{i}].deployment", raw["deployment"]
            if not f.check(path, rules.unknown_name(name, tuple(tasks), "deployment")):
                continue
            served = tasks[name]
            if served is None:
                continue
            kind = str(raw.get("type"))
            by_examples = kind == "domain" and "examples" in raw
            wanted = ("embed",) if by_examples else ("classify",) if kind == "domain" else SIGNAL_TASKS.get(kind, ())
            if wanted and not set(wanted) & set(served):
                how = " (with examples)" if by_examples else ""
                article = "an" if kind[:1] in "aeiou" else "a"
                f.add(path, f"deployment {name!r} serves {', '.join(served) or 'no task'}; {article} {kind} "
                            f"signal{how} needs {' or '.join(wanted)}")


def projections(f: Fields, path: str, raw: object, signals: Mapping[str, Signal | None]) -> tuple[Projection, ...]:
    """An entry's `projections`; `signals` are its signals by name (None: declared but broken)."""
    built = f.items(path, raw, lambda f, p, r, i: _projection(f, p, r, signals), allow_empty=True)
    names = [p.name if p else None for p in built]
    for i in rules.duplicates(names):
        if names[i] is not None:
            f.add(f"{path}[{i}].name", f"duplicate projection {names[i]!r}")
    return tuple(p for p in built if p)


def _projection(f: Fields, path: str, raw: object, signals: Mapping[str, Signal | None]) -> Projection | None:
    m = f.mapping(path, raw, ("name", "inputs", "bands"), required=("name", "inputs", "bands"))
    name = f.string(f"{path}.name", m.get("name", MISSING))
    inputs = f.items(f"{path}.inputs", m.get("inputs", MISSING), lambda f, p, r, i: _input(f, p, r, signals))
    bands = f.items(f"{path}.bands", m.get("bands", MISSING), _band)
    band_names = [b.name if b else None for b in bands]
    for i in rules.duplicates(band_names):
        if band_names[i] is not None:
            f.add(f"{path}.bands[{i}].name", f"duplicate band {band_names[i]!r}")
    for i, band in enumerate(bands[1:], 1):
        previous = bands[i - 1]
        if band is not None and band.min is None:
            f.add(f"{path}.bands[{i}].min", "required: every band but the first starts at its min")
        elif band is not None and previous is not None and previous.min is not None and band.min is not None \
                and band.min <= previous.min:
            f.add(f"{path}.bands[{i}].min", f"expected more than the previous band's min ({previous.min}), "
                                            f"got {band.min}")
    if not name or not inputs or not bands or None in inputs or None in bands:
        return None
    return Projection(name, tuple(i for i in inputs if i), tuple(b for b in bands if b))


def _input(f: Fields, path: str, raw: object, signals: Mapping[str, Signal | None]) -> ProjectionInput | None:
    m = f.mapping(path, raw, ("signal", "weight", "value", "unknown"), required=("signal", "weight"))
    d = defaults(ProjectionInput)
    name = f.string(f"{path}.signal", m.get("signal", MISSING))
    known = name is not None and f.check(f"{path}.signal", rules.unknown_name(name, tuple(signals), "signal"))
    weight = _finite(f, f"{path}.weight", m.get("weight", MISSING))
    value = f.choice(f"{path}.value", m.get("value", d["value"]), VALUES, "value")
    unknown = _finite(f, f"{path}.unknown", m.get("unknown", d["unknown"]))
    target = signals.get(name) if known and name is not None else None
    if value == "score" and target is not None and not isinstance(target, MODEL_SIGNAL_TYPES):
        f.add(f"{path}.value", f"signal {name!r} ({target.type}) has no score; use value: matched")
        return None
    if not (known and name and weight is not None and value and unknown is not None):
        return None
    return ProjectionInput(name, weight, value, unknown)


def _band(f: Fields, path: str, raw: object, i: int) -> Band | None:
    m = f.mapping(path, raw, ("name", "min"), required=("name",))
    name = f.string(f"{path}.name", m.get("name", MISSING))
    low = _finite(f, f"{path}.min", m["min"]) if "min" in m else None
    return Band(name, low) if name and ("min" not in m or low is not None) else None


def _finite(f: Fields, path: str, raw: object) -> float | None:
    value = f.number(path, raw) if raw is not MISSING else None
    if value is not None and not math.isfinite(value):
        f.add(path, f"expected a finite number, got {raw!r}")
        return None
    return value


def expr(f: Fields, path: str, raw: object, signals: tuple[str, ...],
         projected: Mapping[str, tuple[str, ...]]) -> Expr | None:
    """A decision's `when`: a signal name, {projection: name, band: name | [names]}, or one of
    {any: [...]}, {all: [...]}, {not: ...}. `projected` maps each projection to its bands."""
    if isinstance(raw, str):
        return SignalRef(raw) if f.check(path, rules.unknown_name(raw, signals, "signal")) else None
    if isinstance(raw, dict) and "projection" in raw:
        return _projection_ref(f, path, raw, projected)
    if not isinstance(raw, dict) or len(raw) != 1:
        shape = f"keys {', '.join(map(str, raw))}" if isinstance(raw, dict) else repr(raw)
        f.add(path, f"expected a signal name, {{projection: name, band: name}}, or a mapping with one of "
                    f"any, all, not; got {shape}")
        return None
    op, arg = next(iter(raw.items()))
    if op not in OPERATORS:
        f.add(f"{path}.{op}", rules.unknown_key(op, OPERATORS))
        return None
    if op == "not":
        item = expr(f, f"{path}.not", arg, signals, projected)
        return Not(item) if item else None
    parts = f.items(f"{path}.{op}", arg, lambda f, p, r, i: expr(f, p, r, signals, projected))
    items = tuple(part for part in parts if part is not None)
    if not parts or len(items) < len(parts):
        return None
    return AnyOf(items) if op == "any" else AllOf(items)


def _projection_ref(f: Fields, path: str, raw: dict[str, Any], projected: Mapping[str, tuple[str, ...]]
                    ) -> ProjectionRef | None:
    m = f.mapping(path, raw, ("projection", "band"), required=("projection", "band"))
    name = f.string(f"{path}.projection", m["projection"])
    if name is None or not f.check(f"{path}.projection", rules.unknown_name(name, tuple(projected), "projection")):
        return None
    band = m.get("band", MISSING)
    bands = (band,) if isinstance(band, str) else f.strings(f"{path}.band", band)
    if bands is None:
        return None
    ok = True
    for j, item in enumerate(bands):
        where = f"{path}.band" if isinstance(band, str) else f"{path}.band[{j}]"
        ok = f.check(where, rules.unknown_name(item, projected[name], "band", f"bands of {name}")) and ok
    return ProjectionRef(name, bands) if ok else None
