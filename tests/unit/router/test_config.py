from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.router.config import (
    DEFAULT_APIS,
    AcceptConfig,
    AllOf,
    AnyOf,
    BreakerConfig,
    CacheAwareConfig,
    ConfigError,
    ContextLengthSignal,
    DecisionRule,
    DnsConfig,
    EmbeddingSignal,
    EntryConfig,
    EscalateAlgorithm,
    HealthConfig,
    KeywordSignal,
    ListenerConfig,
    Not,
    PoolConfig,
    PrecisePrefixConfig,
    RegexSignal,
    ReplicaConfig,
    SignalRef,
    StaticAlgorithm,
    WeightedAlgorithm,
    load_config,
    parse_config,
)

FULL = yaml.safe_load(r"""
listeners:
  - name: public
    port: 8080
    api_keys: [k1]
    api_keys_env: ROUTER_KEYS
    apis: [chat, completions, models]
  - {name: internal, host: 127.0.0.1, port: 8081}
pools:
  small:
    model: qwen-small
    replicas:
      - url: http://10.0.0.1:8000/
      - {url: "https://small-b.internal/v1"}
    max_inflight: 8
    policy: cache_aware
    cache_aware: {cache_threshold: 0.7, balance_abs: 4}
    health: {path: /ready, interval_s: 1, timeout_s: 0.5}
    breaker: {failures: 5, cooldown_s: 2}
    tokenizer: tiny
    api_key_env: SMALL_KEY
    timeout_s: 30
  big:
    model: qwen-big
    dns: {name: big.svc.cluster.local, port: 9000}
    api_key: secret
entries:
  auto:
    signals:
      - {name: urgent, type: keyword, keywords: [urgent, asap], mode: all, case_sensitive: true}
      - {name: code, type: regex, pattern: "```|^def ", flags: [multiline]}
      - {name: long, type: context_length, min_tokens: 1000}
      - {name: short, type: context_length, max_tokens: 50}
      - {name: poem, type: embedding, examples: [write a poem], threshold: 0.5}
    decisions:
      - name: hard
        when: {all: [long, {not: short}]}
        pools: [big]
      - name: creative
        when: {any: [poem, code]}
        pools: [big, small]
      - when: urgent
        pools: [small]
    default: [small]
    algorithm: {type: weighted, weights: {big: 3}}
  cheap-first:
    default: [small, big]
    algorithm:
      type: escalate
      stages: [small, big]
      accept: {finish_reasons: [stop, length], min_chars: 10, regex: "\\S"}
      deadline_s: 5
      max_calls: 3
  fixed:
    default: [big]
""")
ENV = {"ROUTER_KEYS": "k2, k1,k3", "SMALL_KEY": "sk"}


def test_full_config_builds_every_object() -> None:
    config = parse_config(FULL, "router.yaml", env=ENV)
    assert config.source == "router.yaml"
    assert config.listeners == (
        ListenerConfig("public", 8080, "0.0.0.0", ("k1", "k2", "k3"), ("chat", "completions", "models")),
        ListenerConfig("internal", 8081, "127.0.0.1", (), DEFAULT_APIS))
    assert list(config.pools) == ["small", "big"]
    assert config.pools["small"] == PoolConfig(
        name="small", model="qwen-small",
        replicas=(ReplicaConfig("http://10.0.0.1:8000"), ReplicaConfig("https://small-b.internal/v1")),
        max_inflight=8, policy="cache_aware", cache_aware=CacheAwareConfig(cache_threshold=0.7, balance_abs=4),
        health=HealthConfig("/ready", 1.0, 0.5), breaker=BreakerConfig(5, 2.0), tokenizer="tiny",
        api_key="sk", timeout_s=30.0)
    assert config.pools["big"] == PoolConfig(
        name="big", model="qwen-big", dns=DnsConfig("big.svc.cluster.local", 9000), api_key="secret")
    assert list(config.entries) == ["auto", "cheap-first", "fixed"]
    auto = config.entries["auto"]
    assert auto == EntryConfig(
        name="auto", default=("small",),
        signals=(KeywordSignal("urgent", ("urgent", "asap"), "all", True),
                 RegexSignal("code", "```|^def ", ("multiline",)),
                 ContextLengthSignal("long", 1000, None),
                 ContextLengthSignal("short", 0, 50),
                 EmbeddingSignal("poem", ("write a poem",), 0.5)),
        decisions=(DecisionRule("hard", AllOf((SignalRef("long"), Not(SignalRef("short")))), ("big",)),
                   DecisionRule("creative", AnyOf((SignalRef("poem"), SignalRef("code"))), ("big", "small")),
                   DecisionRule("decision-2", SignalRef("urgent"), ("small",))),
        algorithm=WeightedAlgorithm({"big": 3.0}))
    assert auto.uses_local_embedder
    assert auto.signals[1].compiled.search("x = 1\ndef f(): pass")  # type: ignore[union-attr]
    escalate = config.entries["cheap-first"].algorithm
    assert escalate == EscalateAlgorithm(("small", "big"), AcceptConfig(("stop", "length"), 10, r"\S"), 5.0, 3)
    assert escalate.accept.compiled.pattern == r"\S"  # type: ignore[union-attr]
    assert config.entries["fixed"] == EntryConfig("fixed", ("big",), algorithm=StaticAlgorithm())
    assert not config.entries["fixed"].uses_local_embedder


def test_secrets_stay_out_of_repr() -> None:
    config = parse_config(FULL, env=ENV)
    assert "k1" not in repr(config.listeners[0]) and "secret" not in repr(config.pools["big"])


def _minimal() -> dict[str, Any]:
    return {"listeners": [{"port": 8080}],
            "pools": {"chat": {"model": "m", "replicas": [{"url": "http://a:8000"}]}},
            "entries": {"auto": {"signals": [{"name": "s", "type": "keyword", "keywords": ["x"]}],
                                 "default": ["chat"]}}}


def _errors(edit: Callable[[dict[str, Any]], object], env: dict[str, str] | None = None) -> tuple[str, ...]:
    data = _minimal()
    edit(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, "router.yaml", env=env or {})
    assert str(info.value).startswith("router.yaml: ")
    return info.value.errors


def _pool(data: dict[str, Any]) -> dict[str, Any]:
    return data["pools"]["chat"]  # type: ignore[no-any-return]


def _entry(data: dict[str, Any]) -> dict[str, Any]:
    return data["entries"]["auto"]  # type: ignore[no-any-return]


POOL_KEYS = ("model, replicas, dns, max_inflight, policy, cache_aware, precise_prefix, health, breaker, tokenizer, "
             "api_key, api_key_env, timeout_s, outputs, queue_size")
INVALID = {
    "cache_aware asked of an entry": (
        lambda d: _entry(d).update(algorithm={"type": "cache_aware"}),
        "entries.auto.algorithm.type: cache_aware chooses a replica inside a pool, not a pool: set `policy: "
        "cache_aware` on the pools (pools.<name>.policy) and keep this static"),
    "listener serving an entry that does not exist": (
        lambda d: d["listeners"][0].update(entries=["auto", "autp"]),
        "listeners[0].entries[1]: unknown entry 'autp' (entries: auto)"),
    "bad replica url": (
        lambda d: _pool(d)["replicas"].append({"url": "x"}),
        "pools.chat.replicas[1].url: expected http(s) URL, got 'x'"),
    "url with a query": (
        lambda d: _pool(d)["replicas"].append({"url": "http://b?x=1"}),
        "pools.chat.replicas[1].url: expected http(s) URL, got 'http://b?x=1'"),
    "duplicate replica": (
        lambda d: _pool(d)["replicas"].append({"url": "http://a:8000/"}),
        "pools.chat.replicas[1].url: duplicate replica 'http://a:8000'"),
    "replica key that does not exist": (
        lambda d: _pool(d)["replicas"][0].update(weight=2),
        "pools.chat.replicas[0].weight: unknown key; allowed: url, grpc"),
    "unknown pool key, did you mean": (
        lambda d: _pool(d).update(max_inflght=4),
        f"pools.chat.max_inflght: unknown key; allowed: {POOL_KEYS} (did you mean 'max_inflight'?)"),
    "unknown top-level key": (
        lambda d: d.update(routes=[]),
        "routes: unknown key; allowed: listeners, pools, entries, deployments, store, knowledge, admission"),
    "missing model": (
        lambda d: _pool(d).pop("model"),
        "pools.chat.model: required"),
    "replicas and dns": (
        lambda d: _pool(d).update(dns={"name": "chat.svc"}),
        "pools.chat: set exactly one of replicas, dns"),
    "neither replicas nor dns": (
        lambda d: _pool(d).pop("replicas"),
        "pools.chat: set exactly one of replicas, dns"),
    "dns without name": (
        lambda d: (_pool(d).pop("replicas"), _pool(d).update(dns={"port": 1})),
        "pools.chat.dns.name: required"),
    "unknown policy": (
        lambda d: _pool(d).update(policy="random"),
        "pools.chat.policy: unknown policy 'random' (policies: least_outstanding, cache_aware, round_robin, "
        "precise_prefix)"),
    "cache threshold out of range": (
        lambda d: _pool(d).update(cache_aware={"cache_threshold": 1.5}),
        "pools.chat.cache_aware.cache_threshold: expected number in 0..1, got 1.5"),
    "health path": (
        lambda d: _pool(d).update(health={"path": "health"}),
        "pools.chat.health.path: expected a path starting with '/', got 'health'"),
    "breaker failures": (
        lambda d: _pool(d).update(breaker={"failures": 0}),
        "pools.chat.breaker.failures: expected integer >= 1, got 0"),
    "api_key and api_key_env": (
        lambda d: _pool(d).update(api_key="a", api_key_env={"name": "K", "optional": True}),
        "pools.chat: set at most one of api_key, api_key_env"),
    "port out of range": (
        lambda d: d["listeners"][0].update(port=0),
        "listeners[0].port: expected integer in 1..65535, got 0"),
    "duplicate port": (
        lambda d: d["listeners"].append({"name": "b", "port": 8080}),
        "listeners[1].port: duplicate port 8080"),
    "unknown api": (
        lambda d: d["listeners"][0].update(apis=["chats"]),
        "listeners[0].apis[0]: unknown api 'chats' "
        "(apis: chat, completions, responses, messages, models, explain, images, systemone, memory)"),
    "api_keys_env unset": (
        lambda d: d["listeners"][0].update(api_keys_env="ROUTER_KEYS"),
        "listeners[0].api_keys_env: environment variable ROUTER_KEYS is not set "
        "(to allow that: {name: ROUTER_KEYS, optional: true})"),
    "unknown pool in decision": (
        lambda d: _entry(d).update(decisions=[{"when": "s", "pools": ["chta"]}]),
        "entries.auto.decisions[0].pools[0]: unknown pool 'chta' (pools: chat)"),
    "unknown pool in default": (
        lambda d: _entry(d).update(default=["chat", "big"]),
        "entries.auto.default[1]: unknown pool 'big' (pools: chat)"),
    "unknown signal in when": (
        lambda d: _entry(d).update(decisions=[{"when": {"any": ["s", {"not": "nope"}]}, "pools": ["chat"]}]),
        "entries.auto.decisions[0].when.any[1].not: unknown signal 'nope' (signals: s)"),
    "unknown operator in when": (
        lambda d: _entry(d).update(decisions=[{"when": {"anyy": ["s"]}, "pools": ["chat"]}]),
        "entries.auto.decisions[0].when.anyy: unknown key; allowed: any, all, not (did you mean 'any'?)"),
    "two operators in when": (
        lambda d: _entry(d).update(decisions=[{"when": {"any": ["s"], "all": ["s"]}, "pools": ["chat"]}]),
        "entries.auto.decisions[0].when: expected a signal name, {projection: name, band: name}, or a mapping "
        "with one of any, all, not; got keys any, all"),
    "duplicate decision names": (
        lambda d: _entry(d).update(decisions=[{"name": "a", "when": "s", "pools": ["chat"]}] * 2),
        "entries.auto.decisions[1].name: duplicate decision 'a'"),
    "duplicate signal names": (
        lambda d: _entry(d)["signals"].append({"name": "s", "type": "regex", "pattern": "x"}),
        "entries.auto.signals[1].name: duplicate signal 's'"),
    "unknown signal type": (
        lambda d: _entry(d)["signals"].append({"name": "t", "type": "semantic"}),
        "entries.auto.signals[1].type: unknown signal type 'semantic' "
        "(signal types: keyword, regex, context_length, embedding, classifier, domain, rerank)"),
    "key of another signal type": (
        lambda d: _entry(d)["signals"][0].update(threshold=0.5),
        "entries.auto.signals[0].threshold: unknown key; allowed: name, type, keywords, mode, case_sensitive"),
    "bad regex": (
        lambda d: _entry(d)["signals"].append({"name": "r", "type": "regex", "pattern": "("}),
        "entries.auto.signals[1].pattern: invalid regex '(': missing ), unterminated subpattern at position 0"),
    "unknown regex flag": (
        lambda d: _entry(d)["signals"].append({"name": "r", "type": "regex", "pattern": "x",
                                               "flags": ["ignorcase"]}),
        "entries.auto.signals[1].flags[0]: unknown flag 'ignorcase' "
        "(flags: ignorecase, multiline, dotall, verbose, ascii)"),
    "keyword mode": (
        lambda d: _entry(d)["signals"][0].update(mode="some"),
        "entries.auto.signals[0].mode: unknown mode 'some' (modes: any, all)"),
    "context length range": (
        lambda d: _entry(d)["signals"].append({"name": "c", "type": "context_length", "min_tokens": 10,
                                               "max_tokens": 10}),
        "entries.auto.signals[1].max_tokens: expected more than min_tokens (10), got 10"),
    "embedding threshold": (
        lambda d: _entry(d)["signals"].append({"name": "e", "type": "embedding", "examples": ["hi"],
                                               "threshold": 2}),
        "entries.auto.signals[1].threshold: expected number in 0..1, got 2"),
    "escalate with one stage": (
        lambda d: _entry(d).update(algorithm={"type": "escalate", "stages": ["chat"]}),
        "entries.auto.algorithm.stages: expected at least 2 pools, got 1"),
    "escalate finish reason": (
        lambda d: (d["pools"].update(big={"model": "b", "dns": {"name": "b"}}),
                   _entry(d).update(algorithm={"type": "escalate", "stages": ["chat", "big"],
                                               "accept": {"finish_reasons": ["done"]}})),
        "entries.auto.algorithm.accept.finish_reasons[0]: unknown finish reason 'done' "
        "(finish reasons: stop, length, tool_calls, content_filter)"),
    "weighted without weights": (
        lambda d: _entry(d).update(algorithm={"type": "weighted"}),
        "entries.auto.algorithm.weights: required"),
    "weight for an unknown pool": (
        lambda d: _entry(d).update(algorithm={"type": "weighted", "weights": {"big": 1}}),
        "entries.auto.algorithm.weights.big: unknown pool 'big' (pools: chat)"),
    "precise_prefix without a tokenizer": (
        lambda d: _pool(d).update(policy="precise_prefix", replicas=[{"url": "http://a:8000", "grpc": "a:50051"}]),
        "pools.chat.tokenizer: required by policy precise_prefix: the checkpoint (a --model value) whose chat "
        "template and tokenizer the frontends use, to hash prompts as they do"),
    "precise_prefix replica without grpc": (
        lambda d: _pool(d).update(policy="precise_prefix", tokenizer="tiny",
                                  replicas=[{"url": "http://a:8000", "grpc": "a:50051"}, {"url": "http://b:8000"}]),
        "pools.chat.replicas[1].grpc: required by policy precise_prefix: host:port of the frontend's "
        "--grpc-port, whose KvEvents stream it reads"),
    "precise_prefix over dns": (
        lambda d: (_pool(d).pop("replicas"), _pool(d).update(policy="precise_prefix", tokenizer="tiny",
                                                             dns={"name": "fe"})),
        "pools.chat.dns.grpc_port: required by policy precise_prefix: the frontends' --grpc-port on each address "
        "the name resolves to, whose KvEvents stream it reads"),
    "dns grpc_port out of range": (
        lambda d: (_pool(d).pop("replicas"), _pool(d).update(dns={"name": "fe", "grpc_port": 0})),
        "pools.chat.dns.grpc_port: expected integer in 1..65535, got 0"),
    "grpc address without a port": (
        lambda d: _pool(d).update(replicas=[{"url": "http://a:8000", "grpc": "a"}]),
        "pools.chat.replicas[0].grpc: expected host:port (the frontend's --grpc-port), got 'a'"),
    "grpc address with a scheme": (
        lambda d: _pool(d).update(replicas=[{"url": "http://a:8000", "grpc": "http://a:50051"}]),
        "pools.chat.replicas[0].grpc: expected host:port (the frontend's --grpc-port), got 'http://a:50051'"),
    "grpc port out of range": (
        lambda d: _pool(d).update(replicas=[{"url": "http://a:8000", "grpc": "[::1]:70000"}]),
        "pools.chat.replicas[0].grpc: expected host:port (the frontend's --grpc-port), got '[::1]:70000'"),
    "precise_prefix threshold": (
        lambda d: _pool(d).update(precise_prefix={"cache_threshold": 1.5}),
        "pools.chat.precise_prefix.cache_threshold: expected number in 0..1, got 1.5"),
    "precise_prefix unknown key": (
        lambda d: _pool(d).update(precise_prefix={"block_size": 16}),
        "pools.chat.precise_prefix.block_size: unknown key; allowed: cache_threshold, balance_abs, balance_rel, "
        "pending_s, reconnect_max_s"),
    "unknown algorithm": (
        lambda d: _entry(d).update(algorithm={"type": "random"}),
        "entries.auto.algorithm.type: unknown algorithm type 'random' "
        "(algorithm types: static, weighted, escalate)"),
}


@pytest.mark.parametrize("edit, error", INVALID.values(), ids=INVALID.keys())
def test_invalid_config_names_the_key(edit: Callable[[dict[str, Any]], object], error: str) -> None:
    assert _errors(edit) == (error,)


def test_a_precise_prefix_pool_reads_its_keys() -> None:
    data = _minimal()
    _pool(data).update(policy="precise_prefix", tokenizer="tiny", precise_prefix={"cache_threshold": 0.25},
                       replicas=[{"url": "http://a:8000", "grpc": "a:50051"},
                                 {"url": "http://b:8000", "grpc": "[::1]:9"}])
    pool = parse_config(data).pools["chat"]
    assert pool.policy == "precise_prefix"
    assert [(r.url, r.grpc) for r in pool.replicas] == [("http://a:8000", "a:50051"), ("http://b:8000", "[::1]:9")]
    assert pool.precise_prefix == PrecisePrefixConfig(cache_threshold=0.25)


def test_a_precise_prefix_pool_over_dns_reads_the_grpc_port() -> None:
    data = _minimal()
    _pool(data).pop("replicas")
    _pool(data).update(policy="precise_prefix", tokenizer="tiny", dns={"name": "fe.svc", "grpc_port": 50051})
    assert parse_config(data).pools["chat"].dns == DnsConfig("fe.svc", grpc_port=50051)


def test_a_missing_required_key_is_reported_once() -> None:
    def edit(d: dict[str, Any]) -> None:
        _pool(d).pop("model")
        _pool(d)["replicas"] = [{}]
        _entry(d).clear()
        _entry(d)["signals"] = [{"type": "keyword"}, {"type": "regex", "name": "r"}]
        _entry(d)["decisions"] = [{"when": "r"}]
        _entry(d)["algorithm"] = {"type": "escalate"}

    assert _errors(edit) == (
        "pools.chat.model: required",
        "pools.chat.replicas[0].url: required",
        "entries.auto.default: required",
        "entries.auto.signals[0].name: required",
        "entries.auto.signals[0].keywords: required",
        "entries.auto.signals[1].pattern: required",
        "entries.auto.decisions[0].pools: required",
        "entries.auto.algorithm.stages: required")


def test_api_keys_env() -> None:
    def edit(d: dict[str, Any]) -> None:
        d["listeners"][0]["api_keys_env"] = "ROUTER_KEYS"

    assert _errors(edit, {"ROUTER_KEYS": " , "}) == (
        "listeners[0].api_keys_env: environment variable ROUTER_KEYS holds no value "
        "(to allow that: {name: ROUTER_KEYS, optional: true})",)
    data = _minimal()
    data["listeners"][0]["api_keys_env"] = {"name": "ROUTER_KEYS", "optional": True}
    assert parse_config(data, env={}).listeners[0].api_keys == ()


def test_a_broken_signal_still_defines_its_name() -> None:
    """A decision naming a broken signal reports the signal, not also an unknown name."""
    def edit(d: dict[str, Any]) -> None:
        _entry(d)["signals"].append({"name": "r", "type": "regex", "pattern": "["})
        _entry(d)["decisions"] = [{"when": "r", "pools": ["chat"]}]

    assert _errors(edit) == (
        "entries.auto.signals[1].pattern: invalid regex '[': unterminated character set at position 0",)


def test_all_errors_are_reported_together() -> None:
    def edit(d: dict[str, Any]) -> None:
        d["listeners"][0]["port"] = "80"
        _pool(d)["replicas"].append({"url": "x"})
        _pool(d)["timeout_s"] = -1
        _entry(d)["signals"].append({"name": "r", "type": "regex", "pattern": "("})
        _entry(d)["decisions"] = [{"when": "nope", "pools": ["chat"]}]
        d["entries"]["other"] = {"default": ["gone"], "algorithm": {"type": "escalate", "stages": ["chat"]}}

    assert _errors(edit) == (
        "listeners[0].port: expected integer in 1..65535, got '80'",
        "pools.chat.replicas[1].url: expected http(s) URL, got 'x'",
        "pools.chat.timeout_s: expected number > 0, got -1",
        "entries.auto.signals[1].pattern: invalid regex '(': missing ), unterminated subpattern at position 0",
        "entries.auto.decisions[0].when: unknown signal 'nope' (signals: s, r)",
        "entries.other.default[0]: unknown pool 'gone' (pools: chat)",
        "entries.other.algorithm.stages: expected at least 2 pools, got 1")


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config([1, 2], env={})
    assert info.value.errors == ("(top level): expected mapping, got a list",)


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_minimal()))
    config = load_config(path, env={})
    assert config.source == str(path)
    assert config.pools["chat"].replicas == (ReplicaConfig("http://a:8000"),)


def test_load_config_rejects_a_duplicate_yaml_key(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("listeners:\n  - port: 8080\npools:\n"
                    "  small: {model: a, replicas: [{url: 'http://a'}]}\n"
                    "  small: {model: b, replicas: [{url: 'http://b'}]}\n"
                    "entries:\n  auto: {default: [small]}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    (error,) = info.value.errors
    assert error.startswith("invalid YAML: duplicate key 'small'\n")
    assert "line 5, column 3" in error
    assert str(info.value).startswith(f"{path}: invalid YAML")


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "none.yaml", env={})
    assert info.value.errors == ("cannot read: No such file or directory",)


def test_the_input_is_not_modified() -> None:
    data = copy.deepcopy(FULL)
    parse_config(data, env=ENV)
    assert data == FULL


def test_the_deploy_example_config_is_valid() -> None:
    """`make up` serves deploy/router.yaml: it must load, with or without its optional key variable."""
    path = Path(__file__).resolve().parents[3] / "deploy" / "router.yaml"
    open_config = load_config(path, env={})
    assert list(open_config.entries) == ["tiny", "auto", "careful"] and open_config.listeners[0].api_keys == ()
    keyed = load_config(path, env={"ROUTER_API_KEYS": "k1, k2"})
    assert keyed.listeners[0].api_keys == ("k1", "k2")


def test_keys_left_out_get_the_dataclass_defaults() -> None:
    """The loader reads defaults from the dataclasses: a YAML user who leaves a key out gets exactly them."""
    config = parse_config(yaml.safe_load("""
listeners: [{port: 80}]
pools:
  a: {model: m, replicas: [{url: "http://x"}]}
  b: {model: m, dns: {name: h}}
entries:
  e:
    signals:
      - {name: k, type: keyword, keywords: [x]}
      - {name: r, type: regex, pattern: x}
      - {name: c, type: context_length}
      - {name: v, type: embedding, examples: [x]}
    default: [a]
  f: {default: [a], algorithm: {type: escalate, stages: [a, b]}}
"""), env={})
    assert config.listeners == (ListenerConfig("listener-0", 80),)
    assert config.pools["a"] == PoolConfig("a", "m", (ReplicaConfig("http://x"),))
    assert config.pools["b"] == PoolConfig("b", "m", dns=DnsConfig("h"))
    assert config.entries["e"] == EntryConfig("e", ("a",), (
        KeywordSignal("k", ("x",)), RegexSignal("r", "x"), ContextLengthSignal("c"), EmbeddingSignal("v", ("x",))))
    assert config.entries["f"] == EntryConfig("f", ("a",), algorithm=EscalateAlgorithm(("a", "b")))
