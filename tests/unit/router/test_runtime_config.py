"""The router config's `deployments:` (config/deployments.py): what a valid one builds, every problem
named by its key path, and which deployments the config uses (runtime/demand.py)."""
from __future__ import annotations

from typing import Any

import pytest

from services.engine import config as engine_config
from services.frontend import config as frontend_config
from services.router.config import ConfigError, parse_config
from services.router.runtime.demand import used_deployments


def _config(deployments: object) -> dict[str, Any]:
    return {"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
            "entries": {"e": {"default": ["p"]}}, "deployments": deployments}


def _errors(deployments: object, env: dict[str, str] | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(deployments), env=env or {})
    return info.value.errors


def test_a_managed_and_an_attached_deployment_with_their_defaults() -> None:
    config = parse_config(_config({
        "embedder": {"model": "minilm", "revision": "r1", "tasks": ["embed"],
                     "managed": {"replicas": 2, "backend": "sim", "engine_args": ["--max-model-len", "256"]}},
        "judge": {"model": "cross", "tasks": ["rerank", "score"], "attached": {"urls": ["http://x:9/"]},
                  "max_inflight": 4, "timeout_s": 0.5, "health": {"interval_s": 1}}}), env={})
    embedder, judge = config.deployments["embedder"], config.deployments["judge"]
    assert list(config.deployments) == ["embedder", "judge"]
    assert embedder.managed is not None and embedder.attached is None
    assert (embedder.managed.replicas, embedder.managed.backend, embedder.managed.engine_args) == \
        (2, "sim", ("--max-model-len", "256"))
    assert (embedder.revision, embedder.max_inflight, embedder.timeout_s) == ("r1", 32, 10.0)
    # A managed worker is our frontend: its health check is /ready (engines handshaken), unless set.
    assert embedder.health.path == "/ready"
    assert judge.attached is not None and judge.attached.urls == ("http://x:9",)
    assert (judge.max_inflight, judge.timeout_s, judge.health.path, judge.health.interval_s) == (4, 0.5, "/health", 1.0)
    assert judge.tasks == ("rerank", "score")


def test_no_deployments_key_is_none_declared() -> None:
    raw = _config({})
    del raw["deployments"]
    assert parse_config(raw).deployments == {}


INVALID: dict[str, tuple[object, tuple[str, ...]]] = {
    "neither managed nor attached": ({"d": {"model": "m", "tasks": ["embed"]}},
                                     ("deployments.d: set exactly one of managed, attached",)),
    "both": ({"d": {"model": "m", "tasks": ["embed"], "managed": {}, "attached": {"urls": ["http://a:1"]}}},
             ("deployments.d: set exactly one of managed, attached",)),
    "missing model and tasks": ({"d": {"managed": {}}}, ("deployments.d.model: required",
                                                         "deployments.d.tasks: required")),
    "unknown task": ({"d": {"model": "m", "tasks": ["embedding"], "managed": {}}},
                     ("deployments.d.tasks[0]: unknown task 'embedding' (tasks: embed, classify, score, rerank)",)),
    "unknown backend": ({"d": {"model": "m", "tasks": ["embed"], "managed": {"backend": "tgi"}}},
                        ("deployments.d.managed.backend: unknown backend 'tgi' (backends: vllm, sim)",)),
    "zero replicas": ({"d": {"model": "m", "tasks": ["embed"], "managed": {"replicas": 0}}},
                      ("deployments.d.managed.replicas: expected integer in 1..64, got 0",)),
    "a flag the router sets": (
        {"d": {"model": "m", "tasks": ["embed"], "managed": {"engine_args": ["--port=5"]}}},
        ("deployments.d.managed.engine_args[0]: --port is set by the router for its managed workers (it sets "
         "--model, --backend, --host, --port, --runner, --data-parallel-size-local, --headless, --auth-token, "
         "--auth-token-file)",)),
    "a bad url": ({"d": {"model": "m", "tasks": ["embed"], "attached": {"urls": ["tcp://a:1"]}}},
                  ("deployments.d.attached.urls[0]: expected http(s) URL, got 'tcp://a:1'",)),
    "a repeated url": ({"d": {"model": "m", "tasks": ["embed"],
                              "attached": {"urls": ["http://a:1", "http://a:1/"]}}},
                       ("deployments.d.attached.urls[1]: duplicate url 'http://a:1'",)),
    "an unknown key": ({"d": {"model": "m", "tasks": ["embed"], "managed": {}, "replica": 2}},
                       ("deployments.d.replica: unknown key; allowed: model, revision, tasks, managed, attached, "
                        "max_inflight, timeout_s, start_timeout_s, health, breaker, labels",)),
    "labels without classify": ({"d": {"model": "m", "tasks": ["embed"], "managed": {}, "labels": ["a"]}},
                                ("deployments.d.labels: only for a deployment with task classify "
                                 "(the names of its classes)",)),
    "embed and classify on one model": ({"d": {"model": "m", "tasks": ["embed", "classify"], "managed": {}}},
                                        ("deployments.d.tasks: embed and classify need two deployments: a model "
                                         "has one pooling task, an embedding model's or a classifier's (score "
                                         "and rerank go with either)",)),
    "a zero timeout": ({"d": {"model": "m", "tasks": ["embed"], "managed": {}, "timeout_s": 0}},
                       ("deployments.d.timeout_s: expected number > 0, got 0",)),
    "an unset key variable": ({"d": {"model": "m", "tasks": ["embed"],
                                     "attached": {"urls": ["http://a:1"], "api_key_env": "NOPE"}}},
                              ("deployments.d.attached.api_key_env: environment variable NOPE is not set "
                               "(to allow that: {name: NOPE, optional: true})",)),
    "not a mapping": ([1], ("deployments: expected a non-empty mapping of names, got a list",)),
}


@pytest.mark.parametrize("deployments, errors", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_deployment_is_refused_naming_the_key(deployments: object, errors: tuple[str, ...]) -> None:
    assert _errors(deployments) == errors


def test_only_the_deployments_a_needed_signal_names_are_used_with_the_reasons() -> None:
    config = parse_config({**_config({
        "a": {"model": "m", "tasks": ["classify"], "managed": {}},
        "b": {"model": "m", "tasks": ["embed"], "managed": {}},
        "c": {"model": "m", "tasks": ["rerank"], "attached": {"urls": ["http://a:1"]}}}),
        "entries": {
            "auto": {"default": ["p"], "signals": [
                {"name": "k", "type": "keyword", "keywords": ["x"]},
                {"name": "topic", "type": "rerank", "deployment": "c", "examples": ["x"]},
                {"name": "unread", "type": "embedding", "deployment": "b", "examples": ["x"]}],  # no decision reads it
                "decisions": [{"when": {"any": ["k", "topic"]}, "pools": ["p"]}]},
            "careful": {"default": ["p"], "signals": [
                {"name": "risk", "type": "rerank", "deployment": "c", "examples": ["y"]},
                {"name": "intent", "type": "classifier", "deployment": "a", "labels": ["x"]}],
                "decisions": [{"when": {"all": ["risk", "intent"]}, "pools": ["p"]}]}}})
    assert used_deployments(config) == {
        "a": ["signal entries.careful.signals[1] (intent, classifier)"],
        "c": ["signal entries.auto.signals[1] (topic, rerank)", "signal entries.careful.signals[0] (risk, rerank)"]}


def test_pure_rule_routing_uses_no_deployment() -> None:
    config = parse_config({**_config({"a": {"model": "m", "tasks": ["embed"], "managed": {}}}),
                           "entries": {"e": {"default": ["p"], "signals": [
                               {"name": "k", "type": "keyword", "keywords": ["x"]},
                               {"name": "s", "type": "embedding", "examples": ["hello"]}],
                               "decisions": [{"when": {"any": ["k", "s"]}, "pools": ["p"]}]}}})
    assert used_deployments(config) == {}


def test_a_prefix_of_a_flag_the_router_sets_is_refused_as_the_flag() -> None:
    # argparse would have read --mod as --model (the workers' parsers now refuse abbreviations too).
    assert _errors({"d": {"model": "m", "tasks": ["embed"], "managed": {"frontend_args": ["--mod", "x"]}}}) == (
        "deployments.d.managed.frontend_args[0]: --mod is set by the router for its managed workers (it sets "
        "--model, --host, --port, --served-model-name, --data-parallel-size, --data-parallel-size-local, "
        "--engine-addresses, --api-key, --auth-token, --auth-token-file)",)


def test_the_workers_parsers_refuse_abbreviated_flags() -> None:
    for build in (engine_config.build_parser, frontend_config.build_parser):
        _, unknown = build().parse_known_args(["--model", "m", "--mod", "x"])
        assert unknown == ["--mod", "x"]  # not read as --model


def test_credentials_in_an_attached_url_are_refused_pointing_to_the_key_fields() -> None:
    assert _errors({"d": {"model": "m", "tasks": ["embed"], "attached": {"urls": ["http://u:p@a:1"]}}}) == (
        "deployments.d.attached.urls[0]: credentials in a URL are not allowed (the URL is logged and shown); "
        "set api_key or api_key_env",)


@pytest.mark.parametrize(("tasks", "convert"), [(["classify"], "classify"), (["embed", "score"], "embed"),
                                                (["rerank"], "auto"), (["score", "classify"], "classify")])
def test_a_managed_worker_gets_the_head_its_tasks_need(tasks: list[str], convert: str) -> None:
    """A causal model can serve either head, so the engine is told which; a cross-encoder that only scores
    keeps its own. The deployment's engine_args come after, so a --convert there wins."""
    from services.router.runtime.managed import ManagedReplica, Secrets

    config = parse_config(_config({"d": {"model": "m", "tasks": tasks,
                                         "managed": {"engine_args": ["--convert", "none"]}}}), env={})
    cmd = ManagedReplica(config.deployments["d"], 0, Secrets("t", "k")).engine.cmd
    at = cmd.index("--convert")
    assert cmd[at + 1] == convert and cmd[-2:] == ["--convert", "none"]
    assert engine_config.parse_args(cmd[3:]).convert == "none"  # argparse: the last one given
