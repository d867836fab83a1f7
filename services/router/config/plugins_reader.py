"""Readers of the plugins' keys in the router config: `store`, `knowledge`, and the `plugins` lists of
entries and decisions (types and defaults in plugins.py). Run once by the router process at start, from
the loader; problems go to `Fields` with their key paths."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from services.router.config import rules
from services.router.config.fields import MISSING, Fields, defaults
from services.router.config.plugins import (
    ON_STORE_ERROR,
    PLUGIN_TYPES,
    STORE_BACKENDS,
    KnowledgeConfig,
    PluginConfig,
    StoreConfig,
)

STORE_KEYS = ("backend", "path", "dsn", "dsn_env", "timeout_s", "responses", "responses_ttl_s")
KNOWLEDGE_KEYS = tuple(f.name for f in dataclasses.fields(KnowledgeConfig) if f.name != "name")
PLUGIN_KEYS = {kind: ("type",) + tuple(f.name for f in dataclasses.fields(cls)) for kind, cls in PLUGIN_TYPES.items()}
RECALL_TYPES = ("memory", "rag")  # the plugins that add to the request before it is sent
NEED_STORE = "plugins need a `store` (sqlite or postgres)"
NATIVE_REFUSED = ("plugins hook chat requests (before dispatch and after the answer); a native System One "
                  "recipe (api: systemone) runs none")


@dataclass(frozen=True, slots=True)
class Scope:
    """What a plugin's names may refer to, read before the entries."""

    tasks: Mapping[str, Collection[str] | None]  # each declared deployment's tasks (None: too broken to say)
    knowledge: tuple[str, ...]  # every declared knowledge base's name, broken ones included


def _positive(f: Fields, path: str, raw: object) -> float | None:
    return f.number(path, raw, 0, open_low=True)


def _similarity(f: Fields, path: str, raw: object) -> float | None:
    return f.number(path, raw, -1, 1)


def _at_least_one(f: Fields, path: str, raw: object) -> int | None:
    return f.integer(path, raw, 1)


# How each plugin field is read. A dataclass field missing here fails loudly (KeyError) the first time
# that plugin type is read, so a field added to plugins.py cannot go unchecked.
_VALUES: dict[str, Callable[[Fields, str, Any], object]] = {
    "embedder": Fields.string,
    "knowledge": Fields.string,
    "threshold": _similarity,
    "min_similarity": _similarity,
    "top_k": lambda f, p, v: f.integer(p, v, 1, 100),
    "max_tokens": _at_least_one,
    "max_entries": _at_least_one,
    "max_memories": _at_least_one,
    "ttl_s": _positive,
    "timeout_s": _positive,
    "shared": Fields.boolean,
    "store_tool_calls": Fields.boolean,
    "store_truncated": Fields.boolean,
    "semantic": Fields.boolean,
    "on_store_error": lambda f, p, v: f.choice(p, v, ON_STORE_ERROR, "value"),
}


# ---- store ----

def read_store(f: Fields, raw: object) -> StoreConfig | None:
    """`store:` ({} is SQLite with every default); None, with errors, when it is broken."""
    m = f.mapping("store", raw, STORE_KEYS)
    d = defaults(StoreConfig)
    backend = f.choice("store.backend", m.get("backend", d["backend"]), STORE_BACKENDS, "backend")
    if backend == "postgres":
        if "path" in m:
            f.add("store.path", "only for backend sqlite (the file); postgres is reached by dsn or dsn_env")
        if "dsn" in m and "dsn_env" in m:
            f.add("store", "set at most one of dsn, dsn_env")
        elif "dsn" not in m and "dsn_env" not in m:
            f.add("store.dsn", "required with backend postgres: a libpq URI (postgresql://user@host/db), or "
                               "dsn_env naming the environment variable that holds it")
    elif backend == "sqlite":
        for key in ("dsn", "dsn_env"):
            if key in m:
                f.add(f"store.{key}", "only for backend postgres; sqlite keeps its state in the file `path`")
    path = f.string("store.path", m.get("path", d["path"]))
    dsn = f.string("store.dsn", m["dsn"]) if "dsn" in m else None
    if "dsn_env" in m:
        before = len(f.errors)
        dsn = f.env_value("store.dsn_env", m["dsn_env"])
        if dsn is None and len(f.errors) == before and backend == "postgres":  # an optional one, unset
            f.add("store.dsn_env", "the variable is unset or empty, and postgres needs a dsn (drop optional)")
    timeout = _positive(f, "store.timeout_s", m.get("timeout_s", d["timeout_s"]))
    responses = f.boolean("store.responses", m.get("responses", d["responses"]))
    ttl = _positive(f, "store.responses_ttl_s", m.get("responses_ttl_s", d["responses_ttl_s"]))
    # postgres without a dsn has its error recorded above
    if not isinstance(raw, dict) or None in (backend, path, timeout, responses, ttl) or (backend == "postgres"
                                                                                         and dsn is None):
        return None
    assert backend is not None and path is not None and timeout is not None and responses is not None
    assert ttl is not None
    return StoreConfig(backend, path, dsn if backend == "postgres" else None, timeout, responses, ttl)


def check_store(f: Fields, has_store: bool, raw_entries: Mapping[str, Any]) -> None:
    """Plugins keep their state in the store: any non-empty `plugins` list of a chat entry or decision
    needs `store:`."""
    if has_store:
        return
    users = []
    for name, entry in raw_entries.items():
        if not isinstance(entry, dict) or entry.get("api", "chat") != "chat":
            continue  # a native entry's plugins are refused on their own
        if _listed(entry.get("plugins")):
            users.append(f"entries.{name}.plugins")
        decisions = entry.get("decisions")
        for i, rule in enumerate(decisions if isinstance(decisions, list) else ()):
            if isinstance(rule, dict) and _listed(rule.get("plugins")):
                users.append(f"entries.{name}.decisions[{i}].plugins")
    if users:
        f.add("store", f"required: {NEED_STORE}; plugins are listed at {', '.join(users)}")


def _listed(raw: object) -> bool:
    return isinstance(raw, list) and bool(raw)


# ---- knowledge ----

def read_knowledge(f: Fields, raw: object, tasks: Mapping[str, Collection[str] | None]) -> dict[str, KnowledgeConfig]:
    """`knowledge:` (a mapping name -> knowledge base); the ones that parsed, in file order."""
    if raw is MISSING or raw == {}:  # none declared, or every one commented out
        return {}
    built = {}
    for name, item in f.named("knowledge", raw).items():
        base = _knowledge_base(f, f"knowledge.{name}", name, item, tasks)
        if base is not None:
            built[name] = base
    return built


def declared_knowledge(raw: object) -> tuple[str, ...]:
    """Every knowledge base's name as written, so that a rag plugin naming a broken one is not told it
    is unknown as well."""
    return tuple(name for name in raw if isinstance(name, str)) if isinstance(raw, dict) else ()


def _knowledge_base(f: Fields, path: str, name: str, raw: object,
                    tasks: Mapping[str, Collection[str] | None]) -> KnowledgeConfig | None:
    m = f.mapping(path, raw, KNOWLEDGE_KEYS, required=("paths", "embedder"))
    d = defaults(KnowledgeConfig)
    paths = f.strings(f"{path}.paths", m.get("paths", MISSING))
    embedder = _embedder(f, f"{path}.embedder", m.get("embedder", MISSING), tasks)
    chunk = f.integer(f"{path}.chunk_chars", m.get("chunk_chars", d["chunk_chars"]), 100)
    overlap = f.integer(f"{path}.overlap_chars", m.get("overlap_chars", d["overlap_chars"]), 0)
    if chunk is not None and overlap is not None and overlap >= chunk:
        # each chunk must move the window on, or chunking would never end
        f.add(f"{path}.overlap_chars", f"expected less than chunk_chars ({chunk}), got {overlap}")
        overlap = None
    refresh = f.number(f"{path}.refresh_s", m.get("refresh_s", d["refresh_s"]), 0)
    max_bytes = f.integer(f"{path}.max_file_bytes", m.get("max_file_bytes", d["max_file_bytes"]), 1)
    extensions = f.strings(f"{path}.extensions", m.get("extensions", list(d["extensions"])))
    for j, ext in enumerate(extensions or ()):
        if not (ext.startswith(".") and len(ext) > 1):
            f.add(f"{path}.extensions[{j}]", f"expected a file extension starting with a dot (.md), got {ext!r}")
            extensions = None
    if not isinstance(raw, dict) or None in (paths, embedder, chunk, overlap, refresh, max_bytes, extensions):
        return None
    assert paths is not None and embedder is not None and chunk is not None and overlap is not None
    assert refresh is not None and max_bytes is not None and extensions is not None
    return KnowledgeConfig(name, tuple(dict.fromkeys(paths)), embedder, chunk, overlap, refresh, max_bytes,
                           tuple(dict.fromkeys(extensions)))


def _embedder(f: Fields, path: str, raw: object, tasks: Mapping[str, Collection[str] | None]) -> str | None:
    """A declared deployment that serves `embed` (recall embeds the text through it)."""
    name = f.string(path, raw)
    if name is None or not f.check(path, rules.unknown_name(name, tuple(tasks), "deployment")):
        return None
    served = tasks[name]
    if served is not None and "embed" not in served:
        f.add(path, f"deployment {name!r} serves {', '.join(served) or 'no task'}; an embedder needs embed")
        return None
    return name


# ---- plugins ----

def read_plugins(f: Fields, path: str, raw: object, scope: Scope) -> tuple[PluginConfig, ...] | None:
    """A `plugins` list of an entry or a decision, in order ([] runs none); None when broken."""
    built = f.items(path, raw, lambda f, p, r, i: _plugin(f, p, r, scope), allow_empty=True)
    if not isinstance(raw, list):
        return None
    kinds = [r.get("type") if isinstance(r, dict) and r.get("type") in PLUGIN_TYPES else None for r in raw]
    ok = all(p is not None for p in built)
    for i in rules.duplicates(kinds):
        if kinds[i] is not None:
            ok = f.check(f"{path}[{i}].type", f"duplicate plugin type {kinds[i]!r}: each type runs at most once "
                                              f"a request") and ok
    for i, kind in enumerate(kinds):
        if kind != "semantic_cache":
            continue
        recall = [k for k in kinds[:i] if k in RECALL_TYPES]
        if recall:
            ok = f.check(f"{path}[{i}]", f"semantic_cache must be listed before {recall[0]}: the cache must see "
                                         f"the request as the client sent it, before recall adds to it") and ok
        if raw[i].get("shared") is True and "memory" in kinds:
            ok = f.check(f"{path}[{i}].shared", "a shared cache in the same list as memory is refused: it would "
                                                "hand one user's memory-shaped answer to another tenant (set "
                                                "shared: false)") and ok
    return tuple(p for p in built if p is not None) if ok else None


def _plugin(f: Fields, path: str, raw: object, scope: Scope) -> PluginConfig | None:
    if not isinstance(raw, dict):
        f.mapping(path, raw, ())
        return None
    kind = f.choice(f"{path}.type", raw.get("type"), tuple(PLUGIN_TYPES), "plugin type", "plugin types")
    if kind is None:
        return None
    cls, keys, d = PLUGIN_TYPES[kind], PLUGIN_KEYS[kind][1:], defaults(PLUGIN_TYPES[kind])
    m = f.mapping(path, raw, PLUGIN_KEYS[kind], required=tuple(k for k in keys if k not in d))
    values: dict[str, object] = {}
    for key in keys:
        value = m.get(key, d.get(key, MISSING))
        if key == "embedder":
            values[key] = _embedder(f, f"{path}.{key}", value, scope.tasks)
        else:
            values[key] = None if value is MISSING else _VALUES[key](f, f"{path}.{key}", value)
    knowledge = values.get("knowledge")
    if isinstance(knowledge, str) and not f.check(f"{path}.knowledge", rules.unknown_name(
            knowledge, scope.knowledge, "knowledge base", "knowledge bases")):
        return None
    if any(v is None for v in values.values()):
        return None
    plugin: PluginConfig = cls(**values)
    return plugin


# ---- native recipes ----

def refuse_on_native(f: Fields, path: str, raw: object) -> object:
    """A native entry without `plugins`, its own and its decisions', each refused here with why (not as
    an unknown key)."""
    if not isinstance(raw, dict):
        return raw
    entry = _without_plugins(f, path, raw)
    decisions = entry.get("decisions")
    if isinstance(decisions, list):
        entry["decisions"] = [_without_plugins(f, f"{path}.decisions[{i}]", rule) if isinstance(rule, dict) else rule
                              for i, rule in enumerate(decisions)]
    return entry


def _without_plugins(f: Fields, path: str, raw: dict[str, Any]) -> dict[str, Any]:
    if "plugins" in raw:
        f.add(f"{path}.plugins", NATIVE_REFUSED)
    return {k: v for k, v in raw.items() if k != "plugins"}
