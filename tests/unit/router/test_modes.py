"""The router's modes from its command line (modes.py, __main__.py): engine mode's config (names, families
from the checkpoints, refusals, a routing file's listener used and the rest left inactive), router mode's
default decision model rewriting the signals that embed in-process, the startup lines, and every
command-line mistake refused with exit 2 and a message naming the argument, before anything starts."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.router.__main__ import build_parser, engine_mode, main, router_mode
from services.router.config import (
    DomainSignal,
    EmbeddingSignal,
    ListenerConfig,
    RouterConfig,
    parse_config,
)
from services.router.modes import (
    DEFAULT_EMBEDDER,
    EngineModel,
    Listen,
    ModeError,
    Workers,
    api_keys,
    engine_config,
    engine_models,
    inactive_line,
    startup_line,
    with_default_model,
)

CLS = EngineModel("tiny-classifier", "tiny-classifier", "classifier")
XENC = EngineModel("xenc", "tiny-cross-encoder", "cross_encoder")
EMB = EngineModel("minilm", "minilm", "embedding")

ROUTING = {
    "listeners": [{"name": "public", "host": "127.0.0.2", "port": 9001, "api_keys": ["file-key"]},
                  {"name": "second", "port": 9002}],
    "pools": {"chat": {"model": "m", "replicas": [{"url": "http://a"}]},
              "big": {"model": "b", "replicas": [{"url": "http://b"}]}},
    "entries": {"auto": {"default": ["chat"], "signals": [
        {"name": "near", "type": "embedding", "examples": ["hello"]},  # in-process: rewritten
        {"name": "named", "type": "embedding", "examples": ["hi"], "deployment": "emb"},  # names one: kept
        {"name": "topic", "type": "domain", "domains": ["math"], "examples": {"math": ["integrals"]}},  # rewritten
        {"name": "intent", "type": "domain", "domains": ["code"], "deployment": "cls"},  # a classifier: kept
        {"name": "kw", "type": "keyword", "keywords": ["x"]}],
        "decisions": [{"when": {"any": ["near", "named", "topic", "intent", "kw"]}, "pools": ["big"]}]}},
    "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://w"]}},
                    "cls": {"model": "tiny-classifier", "tasks": ["classify"], "attached": {"urls": ["http://w"]}}},
}


@pytest.fixture
def routing_file(tmp_path: Path) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(ROUTING, sort_keys=False))
    return path


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# ---- engine mode ----

def test_names_and_families_come_from_the_command_line_and_the_checkpoints() -> None:
    assert engine_models(["tiny-classifier", "xenc=tiny-cross-encoder", "minilm"]) == (CLS, XENC, EMB)


def test_a_directory_whose_path_holds_an_equals_sign_is_a_model(tmp_path: Path) -> None:
    path = tmp_path / "a=b"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"],
                                                  "id2label": {"0": "x"}}))
    assert engine_models([str(path)]) == (EngineModel(str(path), str(path), "cross_encoder"),)


@pytest.mark.parametrize(("specs", "message"), [
    (["tiny"], "-e tiny: 'tiny' is a generative (or unknown) architecture; engine mode serves decision models: "
               "embedding, classifier, cross_encoder"),
    (["minilm", "minilm"], "-e minilm: the name 'minilm' is given twice"),
    (["m=minilm", "m=tiny-classifier"], "-e m=tiny-classifier: the name 'm' is given twice"),
    (["/nonexistent/model"], "-e /nonexistent/model: --model '/nonexistent/model': not a directory"),
    (["=minilm"], "-e '=minilm': expected MODEL or NAME=MODEL"),
    (["a b=minilm"], "-e 'a b=minilm': expected MODEL or NAME=MODEL"),
])
def test_what_engine_mode_refuses(specs: list[str], message: str) -> None:
    with pytest.raises(ModeError) as info:
        engine_models(specs)
    assert str(info.value).startswith(message)


def test_engine_modes_config_publishes_each_model_on_one_listener_with_a_managed_deployment() -> None:
    config = engine_config((CLS, XENC, EMB), Workers("sim", 2), Listen())
    assert config.mode == "engine" and dict(config.pools) == {} and dict(config.entries) == {}
    assert config.listeners == (ListenerConfig("engine", 8080, "0.0.0.0", (), ("systemone",),
                                               systemone=("tiny-classifier", "xenc", "minilm")),)
    deployments = config.deployments
    assert list(deployments) == ["tiny-classifier", "xenc", "minilm"]
    assert [(d.model, d.tasks, d.family) for d in deployments.values()] == [
        ("tiny-classifier", ("classify",), "classifier"), ("tiny-cross-encoder", ("score", "rerank"), "cross_encoder"),
        ("minilm", ("embed",), "embedding")]
    for d in deployments.values():
        assert d.managed is not None and d.attached is None
        assert (d.managed.backend, d.managed.replicas, d.managed.engine_args) == ("sim", 2, ())
        assert d.health.path == "/ready"  # a managed worker's frontend is ready once its engine serves


def test_the_flags_give_the_listener() -> None:
    listener = engine_config((EMB,), Workers(), Listen("127.0.0.1", 9999, ("k1", "k2"))).listeners[0]
    assert (listener.host, listener.port, listener.api_keys) == ("127.0.0.1", 9999, ("k1", "k2"))


def test_api_keys_from_the_flags_else_the_environment() -> None:
    env = {"ROUTER_API_KEYS": " a, b ,,a "}
    assert api_keys(["x", "y", "x"], env) == ("x", "y")
    assert api_keys(None, env) == ("a", "b")
    assert api_keys(None, {}) is None and api_keys(None, {"ROUTER_API_KEYS": " , "}) is None


def test_a_routing_file_gives_the_listener_unless_flags_do_and_is_kept_inactive(
        routing_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTER_API_KEYS", raising=False)
    config, inactive = engine_mode(_args("-e", "minilm", "--config", str(routing_file)))
    (listener,) = config.listeners
    assert (listener.name, listener.host, listener.port, listener.api_keys) == ("engine", "127.0.0.2", 9001,
                                                                                ("file-key",))
    assert listener.systemone == ("minilm",) and list(config.deployments) == ["minilm"]
    assert dict(config.entries) == {} and dict(config.pools) == {}  # nothing of the file is served
    assert inactive is not None and list(inactive.entries) == ["auto"]
    assert inactive_line(inactive) == (f"engine mode: routing file {routing_file} loaded and inactive "
                                       "(1 entries, 2 pools not served)")

    monkeypatch.setenv("ROUTER_API_KEYS", "env-key")
    config, _ = engine_mode(_args("-e", "minilm", "--config", str(routing_file), "--port", "7000",
                                  "--host", "::1"))
    assert (config.listeners[0].host, config.listeners[0].port, config.listeners[0].api_keys) == \
        ("::1", 7000, ("env-key",))
    config, _ = engine_mode(_args("-e", "minilm", "--config", str(routing_file), "--api-key", "flag-key"))
    assert config.listeners[0].api_keys == ("flag-key",)


def test_engine_mode_from_the_command_line_with_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTER_API_KEYS", raising=False)
    config, inactive = engine_mode(_args("-e", "tiny-classifier", "xenc=tiny-cross-encoder", "minilm",
                                         "--engine-backend", "sim", "--replicas", "3"))
    assert inactive is None
    assert config == engine_config((CLS, XENC, EMB), Workers("sim", 3), Listen())
    assert [d.managed.backend for d in config.deployments.values() if d.managed] == ["sim"] * 3
    default, _ = engine_mode(_args("-e", "minilm"))
    assert [(d.managed.backend, d.managed.replicas) for d in default.deployments.values() if d.managed] == \
        [("vllm", 1)]


# ---- router mode ----

def test_router_mode_loads_the_file_and_port_overrides_its_first_listener(routing_file: Path) -> None:
    config, inactive = router_mode(_args("--config", str(routing_file), "--port", "7001"))
    assert inactive is None and config.mode == "router"
    assert [(x.name, x.port) for x in config.listeners] == [("public", 7001), ("second", 9002)]
    assert DEFAULT_EMBEDDER not in config.deployments and config.entries["auto"].uses_local_embedder


def test_a_default_decision_model_takes_the_signals_that_embed_in_process(routing_file: Path) -> None:
    config, _ = router_mode(_args("--config", str(routing_file), "minilm", "--engine-backend", "sim"))
    entry = config.entries["auto"]
    deployments = {s.name: getattr(s, "deployment", None) for s in entry.signals}
    assert deployments == {"near": DEFAULT_EMBEDDER, "named": "emb", "topic": DEFAULT_EMBEDDER, "intent": "cls",
                           "kw": None}
    assert not entry.uses_local_embedder  # so the in-process all-MiniLM-L6-v2 is never loaded
    assert entry.deployments_used()[DEFAULT_EMBEDDER] == ("near", "topic")
    assert isinstance(entry.signals[0], EmbeddingSignal) and entry.signals[0].examples == ("hello",)
    assert isinstance(entry.signals[2], DomainSignal) and entry.signals[2].examples == (("math", ("integrals",)),)
    embedder = config.deployments[DEFAULT_EMBEDDER]
    assert (embedder.model, embedder.tasks, embedder.managed and embedder.managed.backend) == \
        ("minilm", ("embed",), "sim")
    assert list(config.deployments) == ["emb", "cls", DEFAULT_EMBEDDER]


def test_the_default_decision_model_must_embed_and_its_name_be_free(routing_file: Path) -> None:
    config = parse_config(ROUTING)
    with pytest.raises(ModeError, match="MODEL 'tiny-classifier': a classifier model; the default decision model "
                                        "embeds .* give an embedding model"):
        with_default_model(config, "tiny-classifier", Workers())
    with pytest.raises(ModeError, match="MODEL 'tiny': a generative"):
        with_default_model(config, "tiny", Workers())
    taken = parse_config({**ROUTING, "deployments": {**ROUTING["deployments"], DEFAULT_EMBEDDER: {
        "model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://w"]}}}}, "r.yaml")
    with pytest.raises(ModeError, match=f"r.yaml already declares deployments.{DEFAULT_EMBEDDER}"):
        with_default_model(taken, "minilm", Workers())


def test_a_config_with_no_in_process_signal_is_left_as_it_was_but_for_the_deployment() -> None:
    plain = parse_config({**ROUTING, "entries": {"auto": {"default": ["chat"]}}})
    config, moved = with_default_model(plain, "minilm", Workers())
    assert moved == 0 and config.entries == plain.entries and DEFAULT_EMBEDDER in config.deployments


# ---- the startup line ----

def test_the_startup_line_says_the_mode() -> None:
    engine = engine_config((CLS, EMB), Workers("sim"), Listen())
    assert startup_line(engine, {}) == ("engine mode: System One for tiny-classifier (classifier, tiny-classifier), "
                                        "minilm (embedding, minilm); no chat backend")
    routed = parse_config(ROUTING)
    published = RouterConfig((ListenerConfig("a", 1, systemone=("cls",)), ListenerConfig("b", 2, systemone=(
        "emb", "cls"))), routed.pools, routed.entries)
    assert startup_line(published, {"chat": 1, "big": 2}) == (
        "router mode: entries auto; pools chat (1 replicas), big (2 replicas); System One models cls, emb")
    assert startup_line(routed, {}).endswith("; pools none; System One models none")


# ---- command-line mistakes: exit 2, the argument named, nothing started ----

@pytest.mark.parametrize(("argv", "message"), [
    ([], "router mode needs --config FILE (its MODEL is optional); engine mode needs -e MODEL [MODEL ...]"),
    (["minilm"], "MODEL 'minilm' alone: router mode needs --config FILE"),
    (["-e", "tiny"], "-e tiny: 'tiny' is a generative (or unknown) architecture"),
    (["-e", "minilm", "minilm"], "-e minilm: the name 'minilm' is given twice"),
    (["-e", "minilm", "--port", "9", "tiny-classifier"], "MODEL 'tiny-classifier': a positional MODEL is router "
                                                         "mode's default decision model"),
    (["-e", "minilm", "--replicas", "0"], "--replicas: expected 1..64, got 0"),
    (["-e", "minilm", "--port", "0"], "--port: expected 1..65535, got 0"),
    (["-e", "minilm", "--engine-backend", "tpu"], "argument --engine-backend: invalid choice: 'tpu'"),
    (["--config", "{file}", "--host", "::"], "--host: engine mode's (-e)"),
    (["--config", "{file}", "--api-key", "k"], "--api-key: engine mode's (-e)"),
    (["--config", "{file}", "--engine-backend", "sim"], "--engine-backend: for the workers the command line starts"),
    (["--config", "{file}", "--replicas", "2"], "--replicas: for the workers the command line starts"),
    (["--config", "{file}", "tiny-cross-encoder"], "MODEL 'tiny-cross-encoder': a cross-encoder model"),
])
def test_command_line_mistakes_exit_2_naming_the_argument(argv: list[str], message: str, routing_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([a.replace("{file}", str(routing_file)) for a in argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_invalid_routing_file_in_engine_mode_exits_2_as_in_router_mode(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad: dict[str, Any] = {**ROUTING, "pools": {"chat": {"model": "m", "replicas": [{"url": "x"}]}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    for argv in (["-e", "minilm", "--config", str(path)], ["--config", str(path)]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert f"{path}: pools.chat.replicas[0].url: expected http(s) URL, got 'x'" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [[""], ["k", "  "]])
def test_an_empty_api_key_is_refused_not_an_open_listener(flags: list[str]) -> None:
    with pytest.raises(ModeError, match="--api-key: a key must be non-empty"):
        api_keys(flags, {})
