"""The router config's plugin keys (config/plugins_reader.py): `store`, `knowledge`, and the `plugins`
lists of entries and decisions; what they build, every problem by its key path and allowed values, and
the embedders they start (runtime/demand.py)."""
from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.router.config import ConfigError, parse_config
from services.router.config.plugins import (
    PLUGIN_TYPES,
    KnowledgeConfig,
    MemoryConfig,
    RagConfig,
    SemanticCacheConfig,
    StoreConfig,
)
from services.router.config.plugins_reader import KNOWLEDGE_KEYS, PLUGIN_KEYS, STORE_KEYS
from services.router.config.types import RouterConfig
from services.router.runtime.demand import used_deployments

BASE = yaml.safe_load(r"""
listeners: [{port: 8080}]
pools:
  small: {model: s, replicas: [{url: "http://a:1"}]}
  big: {model: b, replicas: [{url: "http://b:1"}]}
deployments:
  emb: {model: minilm, tasks: [embed], managed: {backend: sim}}
  emb2: {model: minilm, tasks: [embed, score], attached: {urls: ["http://e:1"]}}
  clf: {model: tiny-classifier, tasks: [classify], managed: {backend: sim}}
store: {}
knowledge:
  handbook: {paths: [docs/], embedder: emb}
entries:
  auto:
    signals: [{name: code, type: keyword, keywords: [def]}]
    default: [small]
    plugins:
      - {type: semantic_cache, embedder: emb}
      - {type: memory, embedder: emb}
      - {type: rag, knowledge: handbook}
    decisions:
      - {name: coding, when: code, pools: [big]}
  native:
    api: systemone
    default: [clf]
""")

Edit = Callable[[dict[str, Any]], object]


def _config(edit: Edit | None = None) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if edit is not None:
        edit(data)
    return data


def _parse(edit: Edit | None = None, env: dict[str, str] | None = None) -> RouterConfig:
    return parse_config(_config(edit), env=env or {})


def _errors(edit: Edit, env: dict[str, str] | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        _parse(edit, env)
    return info.value.errors


def _auto(d: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = d["entries"]["auto"]
    return entry


def _plugin(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: _auto(d)["plugins"][i]


def _set(where: Callable[[dict[str, Any]], dict[str, Any]], **values: object) -> Edit:
    return lambda d: where(d).update(values)


def _plugins(*items: dict[str, Any]) -> Edit:
    return lambda d: _auto(d).update(plugins=list(items))


CACHE = {"type": "semantic_cache", "embedder": "emb"}
MEMORY = {"type": "memory", "embedder": "emb"}
RAG = {"type": "rag", "knowledge": "handbook"}
FULL = yaml.safe_load(r"""
listeners: [{port: 8080}]
pools:
  small: {model: s, replicas: [{url: "http://a:1"}]}
  big: {model: b, replicas: [{url: "http://b:1"}]}
deployments:
  emb: {model: minilm, tasks: [embed], managed: {backend: sim}}
store: {backend: postgres, dsn_env: STATE_DSN, timeout_s: 0.25, responses: false, responses_ttl_s: 60}
knowledge:
  handbook: {paths: [docs/, notes.md, docs/], embedder: emb, chunk_chars: 800, overlap_chars: 100,
             refresh_s: 0, max_file_bytes: 1024, extensions: [.md, .txt]}
  unread: {paths: [old/], embedder: emb}
entries:
  auto:
    signals: [{name: code, type: keyword, keywords: [def]}, {name: hi, type: keyword, keywords: [hi]}]
    default: [small]
    plugins:
      - {type: semantic_cache, embedder: emb, threshold: 0.8, ttl_s: 60, max_entries: 10, shared: false,
         store_tool_calls: true, store_truncated: true, semantic: true, timeout_s: 0.5}
      - {type: memory, embedder: emb, top_k: 3, min_similarity: -0.5, max_tokens: 64, max_memories: 100,
         on_store_error: closed, timeout_s: 2}
      - {type: rag, knowledge: handbook, top_k: 100, min_similarity: 1, max_tokens: 900,
         on_store_error: closed, timeout_s: 3}
    decisions:
      - {name: code, when: code, pools: [big], plugins: []}
      - {name: hello, when: hi, pools: [big], plugins: [{type: semantic_cache, embedder: emb, shared: true}]}
      - {name: other, when: {not: code}, pools: [small]}
""")


def test_every_key_builds_its_dataclass() -> None:
    config = parse_config(FULL, env={"STATE_DSN": "postgresql://u:pw@db/state"})
    assert config.store == StoreConfig("postgres", StoreConfig().path, "postgresql://u:pw@db/state", 0.25, False,
                                       60.0)
    assert list(config.knowledge) == ["handbook", "unread"]  # one nobody reads is still valid
    assert config.knowledge["handbook"] == KnowledgeConfig("handbook", ("docs/", "notes.md"), "emb", 800, 100,
                                                           0.0, 1024, (".md", ".txt"))
    auto = config.entries["auto"]
    assert auto.plugins == (
        SemanticCacheConfig("emb", 0.8, 60.0, 10, False, True, True, True, 0.5),
        MemoryConfig("emb", 3, -0.5, 64, 100, "closed", 2.0),
        RagConfig("handbook", 100, 1.0, 900, "closed", 3.0))
    # [] runs none; a decision's own list replaces the entry's; no list: the entry's
    assert auto.plugins_of("code", False) == ()
    assert auto.plugins_of("hello", False) == (SemanticCacheConfig("emb", shared=True),)
    assert auto.plugins_of("other", False) == auto.plugins_of("default", True) == auto.plugins
    assert [rule.plugins for rule in auto.decisions][::2] == [(), None]


def test_left_out_keys_take_the_dataclasses_defaults() -> None:
    config = _parse()
    assert config.store == StoreConfig()
    assert config.knowledge == {"handbook": KnowledgeConfig("handbook", ("docs/",), "emb")}
    assert config.entries["auto"].plugins == (SemanticCacheConfig("emb"), MemoryConfig("emb"),
                                              RagConfig("handbook"))
    assert config.entries["auto"].decisions[0].plugins is None


def test_no_store_and_no_plugins_keeps_no_state() -> None:
    config = _parse(lambda d: (d.pop("store"), d.pop("knowledge"), _auto(d).pop("plugins")))
    assert config.store is None and config.knowledge == {} and config.entries["auto"].plugins == ()


def test_the_dsn_stays_out_of_repr() -> None:
    config = _parse(lambda d: d.update(store={"backend": "postgres", "dsn": "postgresql://u:hunter2@db/x"}))
    assert config.store is not None and config.store.dsn == "postgresql://u:hunter2@db/x"
    assert "hunter2" not in repr(config)


def test_the_bounds_themselves_are_allowed() -> None:
    config = _parse(lambda d: (
        _plugins({**CACHE, "threshold": -1}, {**MEMORY, "top_k": 1, "min_similarity": 1, "max_tokens": 1,
                                             "max_memories": 1}, {**RAG, "top_k": 100})(d),
        d["knowledge"]["handbook"].update(chunk_chars=100, overlap_chars=0, refresh_s=0, max_file_bytes=1)))
    assert config.entries["auto"].plugins[0] == SemanticCacheConfig("emb", threshold=-1.0)
    assert config.knowledge["handbook"].chunk_chars == 100


def test_a_shared_cache_may_run_with_rag_and_memory_may_follow_the_cache() -> None:
    # only memory makes an answer one user's own; rag's sources are the same for every tenant
    config = _parse(_plugins({**CACHE, "shared": True}, RAG))
    assert config.entries["auto"].plugins[0] == SemanticCacheConfig("emb", shared=True)


def test_a_rag_plugin_naming_a_broken_knowledge_base_is_told_only_the_base_s_problem() -> None:
    assert _errors(lambda d: d["knowledge"]["handbook"].update(chunk_chars=10)) == (
        "knowledge.handbook.chunk_chars: expected integer >= 100, got 10",)


KEYS_CACHE = ("type, embedder, threshold, ttl_s, max_entries, shared, store_tool_calls, store_truncated, "
              "semantic, timeout_s")
NATIVE = ("plugins hook chat requests (before dispatch and after the answer); a native System One recipe "
          "(api: systemone) runs none")
INVALID: dict[str, tuple[Edit, tuple[str, ...]] | tuple[Edit, tuple[str, ...], dict[str, str]]] = {
    # ---- unknown keys ----
    "unknown plugin key": (
        _set(_plugin(0), treshold=0.9),
        (f"entries.auto.plugins[0].treshold: unknown key; allowed: {KEYS_CACHE} (did you mean 'threshold'?)",)),
    "a key of another plugin type": (
        _set(_plugin(2), embedder="emb"),
        ("entries.auto.plugins[2].embedder: unknown key; allowed: type, knowledge, top_k, min_similarity, "
         "max_tokens, on_store_error, timeout_s",)),
    "unknown store key": (
        lambda d: d.update(store={"file": "x.db"}),
        ("store.file: unknown key; allowed: backend, path, dsn, dsn_env, timeout_s, responses, responses_ttl_s",)),
    "unknown knowledge key": (
        _set(lambda d: d["knowledge"]["handbook"], path="docs/"),
        ("knowledge.handbook.path: unknown key; allowed: paths, embedder, chunk_chars, overlap_chars, refresh_s, "
         "max_file_bytes, extensions (did you mean 'paths'?)",)),
    "knowledge not a mapping of names": (
        lambda d: d.update(knowledge=[{"paths": ["a"]}]),
        ("knowledge: expected a non-empty mapping of names, got a list",
         "entries.auto.plugins[2].knowledge: unknown knowledge base 'handbook' (knowledge bases: none defined)")),
    # ---- types ----
    "unknown plugin type": (
        _set(_plugin(0), type="cache"),
        ("entries.auto.plugins[0].type: unknown plugin type 'cache' (plugin types: semantic_cache, memory, rag)",)),
    "a plugin without a type": (
        lambda d: _plugin(0)(d).pop("type"),
        ("entries.auto.plugins[0].type: required; one of semantic_cache, memory, rag",)),
    "a plugin type twice in one list": (
        _plugins(CACHE, MEMORY, {**MEMORY, "top_k": 2}),
        ("entries.auto.plugins[2].type: duplicate plugin type 'memory': each type runs at most once a request",)),
    "plugins not a list": (
        lambda d: _auto(d).update(plugins={"type": "rag"}),
        ("entries.auto.plugins: expected a list, got a mapping",)),
    "a plugin not a mapping": (
        _plugins("rag"),
        ("entries.auto.plugins[0]: expected mapping, got 'rag'",)),
    "a required key": (
        lambda d: _plugin(1)(d).pop("embedder"),
        ("entries.auto.plugins[1].embedder: required",)),
    # ---- names ----
    "an unknown embedder": (
        _set(_plugin(0), embedder="minilm"),
        ("entries.auto.plugins[0].embedder: unknown deployment 'minilm' (deployments: emb, emb2, clf)",)),
    "an embedder that does not embed": (
        _set(_plugin(1), embedder="clf"),
        ("entries.auto.plugins[1].embedder: deployment 'clf' serves classify; an embedder needs embed",)),
    "a knowledge base's embedder that does not embed": (
        _set(lambda d: d["knowledge"]["handbook"], embedder="clf"),
        ("knowledge.handbook.embedder: deployment 'clf' serves classify; an embedder needs embed",)),
    "a knowledge base's unknown embedder": (
        _set(lambda d: d["knowledge"]["handbook"], embedder="nope"),
        ("knowledge.handbook.embedder: unknown deployment 'nope' (deployments: emb, emb2, clf)",)),
    "an unknown knowledge base": (
        _set(_plugin(2), knowledge="manual"),
        ("entries.auto.plugins[2].knowledge: unknown knowledge base 'manual' (knowledge bases: handbook)",)),
    "empty paths": (
        _set(lambda d: d["knowledge"]["handbook"], paths=[]),
        ("knowledge.handbook.paths: expected a non-empty list, got an empty list",)),
    "a knowledge path not a string": (
        _set(lambda d: d["knowledge"]["handbook"], paths=["docs/", 3]),
        ("knowledge.handbook.paths[1]: expected a non-empty string, got 3",)),
    "a knowledge base without paths or embedder": (
        lambda d: d["knowledge"].update(handbook={}),
        ("knowledge.handbook.paths: required", "knowledge.handbook.embedder: required")),
    # ---- ranges ----
    "threshold past 1": (
        _set(_plugin(0), threshold=1.5),
        ("entries.auto.plugins[0].threshold: expected number in -1..1, got 1.5",)),
    "min_similarity below -1": (
        _set(_plugin(1), min_similarity=-1.01),
        ("entries.auto.plugins[1].min_similarity: expected number in -1..1, got -1.01",)),
    "top_k 0": (
        _set(_plugin(1), top_k=0),
        ("entries.auto.plugins[1].top_k: expected integer in 1..100, got 0",)),
    "top_k past 100": (
        _set(_plugin(2), top_k=101),
        ("entries.auto.plugins[2].top_k: expected integer in 1..100, got 101",)),
    "max_tokens 0": (
        _set(_plugin(2), max_tokens=0),
        ("entries.auto.plugins[2].max_tokens: expected integer >= 1, got 0",)),
    "ttl_s 0": (
        _set(_plugin(0), ttl_s=0),
        ("entries.auto.plugins[0].ttl_s: expected number > 0, got 0",)),
    "max_entries 0": (
        _set(_plugin(0), max_entries=0),
        ("entries.auto.plugins[0].max_entries: expected integer >= 1, got 0",)),
    "max_memories 0": (
        _set(_plugin(1), max_memories=0),
        ("entries.auto.plugins[1].max_memories: expected integer >= 1, got 0",)),
    "timeout_s 0": (
        _set(_plugin(2), timeout_s=0),
        ("entries.auto.plugins[2].timeout_s: expected number > 0, got 0",)),
    "a flag not a boolean": (
        _set(_plugin(0), semantic="yes"),
        ("entries.auto.plugins[0].semantic: expected true or false, got 'yes'",)),
    "on_store_error not open or closed": (
        _set(_plugin(1), on_store_error="fail"),
        ("entries.auto.plugins[1].on_store_error: unknown value 'fail' (values: open, closed)",)),
    "chunk_chars below 100": (
        _set(lambda d: d["knowledge"]["handbook"], chunk_chars=99),
        ("knowledge.handbook.chunk_chars: expected integer >= 100, got 99",)),
    "overlap as long as a chunk": (
        _set(lambda d: d["knowledge"]["handbook"], chunk_chars=500, overlap_chars=500),
        ("knowledge.handbook.overlap_chars: expected less than chunk_chars (500), got 500",)),
    "a negative overlap": (
        _set(lambda d: d["knowledge"]["handbook"], overlap_chars=-1),
        ("knowledge.handbook.overlap_chars: expected integer >= 0, got -1",)),
    "a negative refresh": (
        _set(lambda d: d["knowledge"]["handbook"], refresh_s=-1),
        ("knowledge.handbook.refresh_s: expected number >= 0, got -1",)),
    "max_file_bytes 0": (
        _set(lambda d: d["knowledge"]["handbook"], max_file_bytes=0),
        ("knowledge.handbook.max_file_bytes: expected integer >= 1, got 0",)),
    "an extension without its dot": (
        _set(lambda d: d["knowledge"]["handbook"], extensions=[".md", "txt", "."]),
        ("knowledge.handbook.extensions[1]: expected a file extension starting with a dot (.md), got 'txt'",
         "knowledge.handbook.extensions[2]: expected a file extension starting with a dot (.md), got '.'")),
    # ---- the store ----
    "plugins without a store": (
        lambda d: (d.pop("store"), _auto(d)["decisions"][0].update(plugins=[MEMORY])),
        ("store: required: plugins need a `store` (sqlite or postgres); plugins are listed at "
         "entries.auto.plugins, entries.auto.decisions[0].plugins",)),
    "a decision's plugins without a store": (
        lambda d: (d.pop("store"), _auto(d).pop("plugins"), _auto(d)["decisions"][0].update(plugins=[RAG])),
        ("store: required: plugins need a `store` (sqlite or postgres); plugins are listed at "
         "entries.auto.decisions[0].plugins",)),
    "an unknown backend": (
        lambda d: d.update(store={"backend": "redis"}),
        ("store.backend: unknown backend 'redis' (backends: sqlite, postgres)",)),
    "postgres without a dsn": (
        lambda d: d.update(store={"backend": "postgres"}),
        ("store.dsn: required with backend postgres: a libpq URI (postgresql://user@host/db), or dsn_env naming "
         "the environment variable that holds it",)),
    "postgres with dsn and dsn_env": (
        lambda d: d.update(store={"backend": "postgres", "dsn": "postgresql://db/x", "dsn_env": "DSN"}),
        ("store: set at most one of dsn, dsn_env",), {"DSN": "postgresql://db/y"}),
    "postgres with a path": (
        lambda d: d.update(store={"backend": "postgres", "dsn": "postgresql://db/x", "path": "x.db"}),
        ("store.path: only for backend sqlite (the file); postgres is reached by dsn or dsn_env",)),
    "postgres with an unset dsn_env": (
        lambda d: d.update(store={"backend": "postgres", "dsn_env": "DSN"}),
        ("store.dsn_env: environment variable DSN is not set (to allow that: {name: DSN, optional: true})",)),
    "postgres with an optional dsn_env left unset": (
        lambda d: d.update(store={"backend": "postgres", "dsn_env": {"name": "DSN", "optional": True}}),
        ("store.dsn_env: the variable is unset or empty, and postgres needs a dsn (drop optional)",)),
    "sqlite with a dsn": (
        lambda d: d.update(store={"dsn": "postgresql://db/x"}),
        ("store.dsn: only for backend postgres; sqlite keeps its state in the file `path`",)),
    "sqlite with a dsn_env": (
        lambda d: d.update(store={"backend": "sqlite", "dsn_env": "DSN"}),
        ("store.dsn_env: only for backend postgres; sqlite keeps its state in the file `path`",),
        {"DSN": "postgresql://db/x"}),
    "a store path not a string": (
        lambda d: d.update(store={"path": 5}),
        ("store.path: expected a non-empty string, got 5",)),
    "a store not a mapping": (
        lambda d: d.update(store="sqlite"),
        ("store: expected mapping, got 'sqlite'",)),
    "store timeout 0": (
        lambda d: d.update(store={"timeout_s": 0}),
        ("store.timeout_s: expected number > 0, got 0",)),
    "responses not a boolean": (
        lambda d: d.update(store={"responses": "on"}),
        ("store.responses: expected true or false, got 'on'",)),
    "responses_ttl_s 0": (
        lambda d: d.update(store={"responses_ttl_s": 0}),
        ("store.responses_ttl_s: expected number > 0, got 0",)),
    # ---- native recipes ----
    "a native entry's plugins": (
        lambda d: d["entries"]["native"].update(plugins=[CACHE]),
        (f"entries.native.plugins: {NATIVE}",)),
    "a native decision's plugins, even none": (
        lambda d: d["entries"]["native"].update(
            signals=[{"name": "k", "type": "keyword", "keywords": ["x"]}],
            decisions=[{"name": "x", "when": "k", "stages": ["clf"], "plugins": []}]),
        (f"entries.native.decisions[0].plugins: {NATIVE}",)),
    # ---- order and isolation ----
    "a shared cache with memory": (
        _plugins({**CACHE, "shared": True}, MEMORY),
        ("entries.auto.plugins[0].shared: a shared cache in the same list as memory is refused: it would hand "
         "one user's memory-shaped answer to another tenant (set shared: false)",)),
    "a shared cache with memory in a decision's list": (
        lambda d: _auto(d)["decisions"][0].update(plugins=[MEMORY, {**CACHE, "shared": True}][::-1]),
        ("entries.auto.decisions[0].plugins[0].shared: a shared cache in the same list as memory is refused: "
         "it would hand one user's memory-shaped answer to another tenant (set shared: false)",)),
    "the cache after memory": (
        _plugins(MEMORY, CACHE),
        ("entries.auto.plugins[1]: semantic_cache must be listed before memory: the cache must see the request "
         "as the client sent it, before recall adds to it",)),
    "the cache after rag": (
        _plugins(RAG, CACHE),
        ("entries.auto.plugins[1]: semantic_cache must be listed before rag: the cache must see the request as "
         "the client sent it, before recall adds to it",)),
    "a decision's unknown key": (
        lambda d: _auto(d)["decisions"][0].update(plugin=[]),
        ("entries.auto.decisions[0].plugin: unknown key; allowed: name, when, pools, plugins "
         "(did you mean 'plugins'?)",)),
}


@pytest.mark.parametrize("case", INVALID.values(), ids=INVALID.keys())
def test_invalid_plugin_config_names_the_key(case: tuple[Any, ...]) -> None:
    edit, expected, env = case if len(case) == 3 else (*case, None)
    assert _errors(edit, env) == expected


def test_used_embedders_say_which_plugin_or_knowledge_base_uses_them() -> None:
    config = _parse(lambda d: (
        d["entries"].pop("native"),
        d["knowledge"].update(unread={"paths": ["x"], "embedder": "emb2"}),
        _plugin(1)(d).update(embedder="emb2"),
        _auto(d)["decisions"][0].update(plugins=[{**CACHE, "embedder": "emb2"}])))
    assert used_deployments(config) == {
        "emb": ["embedder of plugin entries.auto.plugins[0] (semantic_cache)", "embedder of knowledge base handbook"],
        "emb2": ["embedder of plugin entries.auto.plugins[1] (memory)",
                 "embedder of plugin entries.auto.decisions[0].plugins[0] (semantic_cache)"]}


def test_an_exact_only_cache_and_an_unread_knowledge_base_start_nothing() -> None:
    config = _parse(lambda d: (_plugins({**CACHE, "semantic": False})(d), d["entries"].pop("native"),
                               d["knowledge"].update(unread={"paths": ["x"], "embedder": "emb2"})))
    assert used_deployments(config) == {}


def test_the_documented_example_loads_with_its_plugins() -> None:
    text = (Path(__file__).parents[3] / "docs" / "router-config.md").read_text()
    example = text.split("\n## Plugins\n", 1)[1]
    config = parse_config(yaml.safe_load(example.split("```yaml\n", 1)[1].split("\n```", 1)[0]),
                          env={"STATE_DSN": "postgresql://router@db/state"})
    assert config.store is not None and config.store.backend == "postgres"
    assert [p.type for p in config.entries["auto"].plugins] == ["semantic_cache", "memory", "rag"]
    assert config.entries["auto"].plugins_of("code", False) == ()
    assert "handbook" in config.knowledge


def _section(text: str, title: str) -> str:
    return text.split(f"\n### {title}\n", 1)[1].split("\n#", 1)[0]


def test_every_key_has_a_row_in_its_documented_table() -> None:
    text = (Path(__file__).parents[3] / "docs" / "router-config.md").read_text()
    tables = {"store": STORE_KEYS, "knowledge.\\<name\\>": KNOWLEDGE_KEYS,
              **{kind: PLUGIN_KEYS[kind] for kind in PLUGIN_TYPES}}
    missing = [f"{title}: {key}" for title, keys in tables.items() for key in keys
               if f"\n| `{key}` |" not in _section(text, title)]
    assert missing == []
