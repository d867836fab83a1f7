"""The router config's admission keys (config/admission_reader.py): `admission:` (priority classes,
shared limits), a listener's `limits`, `user_limits` and `keys`, a pool's `queue_size`; what they build,
and every problem by its key path and allowed values, never showing a key."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from services.router.config import ConfigError, parse_config
from services.router.config.admission import (
    DEFAULT_KEY,
    NO_LIMITS,
    AdmissionConfig,
    KeySettings,
    Limits,
    PriorityClass,
    key_label,
)
from services.router.config.types import RouterConfig

BASE = yaml.safe_load(r"""
listeners:
  - port: 8080
    api_keys: [k-team-a, k-team-b, k-batch]
    api_keys_env: EXTRA_KEYS
    limits: {requests_per_minute: 600, tokens_per_minute: 200000}
    user_limits: {requests_per_minute: 60}
    keys:
      - {key: k-team-a, name: team-a, tenant: alpha, priority: interactive, priority_header: true,
         limits: {requests_per_minute: 6000}}
      - {key: k-batch, name: nightly, priority: batch, user_limits: {tokens_per_minute: 1000}}
      - {key_env: ONE_KEY, name: from-env, tenant: alpha}
admission:
  priorities:
    - {name: interactive, queue_ttl_s: 5}
    - {name: standard}
    - {name: batch, queue_ttl_s: 120}
  starvation_s: 4
pools:
  p: {model: m, replicas: [{url: "http://a:1"}], queue_size: 256}
entries:
  auto: {default: [p]}
""")
ENV = {"EXTRA_KEYS": "k-env-1,k-env-2", "ONE_KEY": "k-env-2"}

Edit = Callable[[dict[str, Any]], object]


def _parse(edit: Edit | None = None, env: dict[str, str] | None = None) -> RouterConfig:
    data = copy.deepcopy(BASE)
    if edit is not None:
        edit(data)
    return parse_config(data, env=ENV if env is None else env)


def _errors(edit: Edit, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _parse(edit, env)
    return info.value.errors


def test_what_the_keys_build() -> None:
    config = _parse()
    listener = config.listeners[0]
    assert config.admission == AdmissionConfig(
        (PriorityClass("interactive", 5.0), PriorityClass("standard", 30.0), PriorityClass("batch", 120.0)),
        "standard", 4.0, False, "open")
    assert listener.limits == Limits(600, 200000) and listener.user_limits == Limits(60, None)
    assert listener.key_settings("k-team-a") == KeySettings("team-a", "alpha", "interactive", True, Limits(6000))
    assert listener.key_settings("k-batch") == KeySettings("nightly", None, "batch", False, None, Limits(None, 1000))
    assert listener.key_settings("k-env-2") == KeySettings("from-env", "alpha")
    assert listener.key_settings("k-team-b") is DEFAULT_KEY and listener.key_settings(None) is DEFAULT_KEY
    assert config.pools["p"].queue_size == 256
    assert config.admission.rank("interactive") == 0 and config.admission.rank("batch") == 2
    assert "k-team-a" not in repr(listener)  # keys stay out of reprs and logs


def test_defaults_admit_as_before() -> None:
    def bare(data: dict[str, Any]) -> None:
        del data["admission"]
        for key in ("limits", "user_limits", "keys"):
            del data["listeners"][0][key]
        del data["pools"]["p"]["queue_size"]

    config = _parse(bare)
    assert config.admission == AdmissionConfig() and config.admission.default_priority == "standard"
    assert config.listeners[0].limits == NO_LIMITS and not NO_LIMITS
    assert config.listeners[0].keys == {} and config.pools["p"].queue_size == 0


def test_a_key_label_is_short_stable_and_not_the_key() -> None:
    assert key_label("k-team-b") == key_label("k-team-b") != key_label("k-team-a")
    assert key_label("k-team-b").startswith("key-") and "team" not in key_label("k-team-b")


def _set(path: str, value: object) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


@pytest.mark.parametrize("edit, error", [
    (_set("listeners.0.keys.0.priority", "urgent"),
     "listeners[0].keys[0].priority: unknown class 'urgent' (classes: interactive, standard, batch)"),
    (_set("listeners.0.keys.1.key", "k-unknown"),
     "listeners[0].keys[1].key: not one of this listener's api_keys or api_keys_env (the key is not shown)"),
    (_set("listeners.0.keys.1.key", "k-team-a"),
     "listeners[0].keys[1].key: this key's settings are already given (the key is not shown)"),
    (_set("listeners.0.keys.1", {"key": "k-batch", "key_env": "ONE_KEY"}),
     "listeners[0].keys[1]: set exactly one of key, key_env"),
    (_set("listeners.0.keys.1.name", "team-a"),
     "listeners[0].keys[1].name: 'team-a' already names listeners[0].keys[0]"),
    (_set("listeners.0.keys.0.colour", "red"), "listeners[0].keys[0].colour: unknown key"),
    (_set("listeners.0.limits.requests_per_minute", 0),
     "listeners[0].limits.requests_per_minute: expected integer >= 1, got 0"),
    (_set("listeners.0.user_limits", {"requests_per_hour": 5}),
     "listeners[0].user_limits.requests_per_hour: unknown key"),
    (_set("listeners.0.keys.0.limits.tokens_per_minute", "lots"),
     "listeners[0].keys[0].limits.tokens_per_minute: expected integer >= 1, got 'lots'"),
    (_set("listeners.0.keys", {}), "listeners[0].keys: expected a non-empty list"),
    (_set("admission.priorities", [{"name": "fast"}, {"name": "fast"}]),
     "admission.priorities: duplicate class 'fast'"),
    (_set("admission.priorities", [{"name": "fast"}, {"name": "slow"}]),
     "admission.default_priority: required when no class is named standard; one of fast, slow"),
    (_set("admission.default_priority", "urgent"),
     "admission.default_priority: unknown class 'urgent' (classes: interactive, standard, batch)"),
    (_set("admission.priorities.0.queue_ttl_s", 0), "admission.priorities[0].queue_ttl_s: expected number > 0"),
    (_set("admission.starvation_s", -1), "admission.starvation_s: expected number > 0"),
    (_set("admission.shared", True), "admission.shared: needs a `store` to count in"),
    (_set("admission.on_store_error", "ignore"), "admission.on_store_error: unknown value 'ignore'"),
    (_set("admission.fairness", "strict"), "admission.fairness: unknown key"),
    (_set("pools.p.queue_size", -1), "pools.p.queue_size: expected integer in 0..1000000, got -1"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 40 else None)
def test_problems_name_their_key(edit: Edit, error: str) -> None:
    errors = _errors(edit)
    assert any(e.startswith(error) for e in errors), errors
    assert not any("k-team" in e or "k-batch" in e or "k-unknown" in e for e in errors), errors


def test_keys_on_an_open_listener_are_refused() -> None:
    def open_listener(data: dict[str, Any]) -> None:
        listener = data["listeners"][0]
        del listener["api_keys"], listener["api_keys_env"]
        listener["keys"] = [{"key": "k-team-a"}]
    errors = _errors(open_listener)
    assert "listeners[0].keys: a listener without api_keys is open: there are no keys to set" in errors


def test_a_key_env_that_is_unset_says_so() -> None:
    errors = _errors(lambda data: None, env={"EXTRA_KEYS": "k-env-1"})
    assert any(e.startswith("listeners[0].keys[2].key_env: environment variable ONE_KEY is not set") for e in errors)


def test_shared_limits_with_a_store_are_read() -> None:
    def shared(data: dict[str, Any]) -> None:
        data["store"] = {}
        data["admission"].update(shared=True, on_store_error="closed")
    config = _parse(shared)
    assert config.admission.shared and config.admission.on_store_error == "closed"
