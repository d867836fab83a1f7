"""Model-backed signals in the router config (config/recipe.py): what each kind reads, and errors that name
the key: a deployment that is not declared, or that does not serve what the signal asks."""
from __future__ import annotations

from typing import Any

import pytest

from services.router.config import (
    ClassifierSignal,
    ConfigError,
    DomainSignal,
    EmbeddingSignal,
    RerankSignal,
    parse_config,
)

ATTACHED = {"urls": ["http://worker:8000"]}  # where a deployment's workers are (no worker is called)

DEPLOYMENTS = {"intent": {"model": "clf", "tasks": ["classify"], "attached": ATTACHED},
               "minilm": {"model": "minilm", "tasks": ["embed"], "attached": ATTACHED},
               "xenc": {"model": "xenc", "tasks": ["score"], "attached": ATTACHED}}


def _config(*signals: dict[str, Any], **entry: Any) -> dict[str, Any]:
    return {"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a"}]}},
            "deployments": DEPLOYMENTS,
            "entries": {"auto": {"signals": list(signals), "default": ["p"],
                                 "decisions": [{"when": {"any": [s["name"] for s in signals]}, "pools": ["p"]}],
                                 **entry}}}


def _errors(*signals: dict[str, Any], **entry: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(*signals, **entry))
    return info.value.errors


def test_each_kind_from_the_config() -> None:
    entry = parse_config(_config(
        {"name": "code", "type": "classifier", "deployment": "intent", "labels": ["code", "debug"], "threshold": 0.7},
        {"name": "topic", "type": "domain", "deployment": "intent", "domains": ["math"]},
        {"name": "near", "type": "domain", "domains": ["math"], "deployment": "minilm",
         "examples": {"math": ["integrals"], "cooking": ["recipes", "baking"]}},
        {"name": "local", "type": "domain", "domains": ["math"], "examples": {"math": ["integrals"]}},
        {"name": "poem", "type": "embedding", "examples": ["write a poem"], "deployment": "minilm"},
        {"name": "faq", "type": "rerank", "deployment": "xenc", "examples": ["refund policy"], "threshold": 0.8},
        signal_budget_s=0.25)).entries["auto"]
    assert entry.signals == (
        ClassifierSignal("code", "intent", ("code", "debug"), 0.7),
        DomainSignal("topic", ("math",), 0.5, "intent"),
        DomainSignal("near", ("math",), 0.5, "minilm", (("math", ("integrals",)), ("cooking", ("recipes", "baking")))),
        DomainSignal("local", ("math",), 0.5, None, (("math", ("integrals",)),)),
        EmbeddingSignal("poem", ("write a poem",), 0.6, "minilm"),
        RerankSignal("faq", "xenc", ("refund policy",), 0.8))
    assert entry.signal_budget_s == 0.25
    assert entry.uses_local_embedder  # `local` names no deployment
    assert entry.deployments_used() == {"intent": ("code", "topic"), "minilm": ("near", "poem"), "xenc": ("faq",)}


def test_a_signal_no_decision_uses_starts_no_deployment() -> None:
    config = _config({"name": "code", "type": "classifier", "deployment": "intent", "labels": ["code"]},
                     {"name": "kw", "type": "keyword", "keywords": ["x"]})
    config["entries"]["auto"]["decisions"] = [{"when": "kw", "pools": ["p"]}]
    entry = parse_config(config).entries["auto"]
    assert entry.needed == {"kw"} and entry.deployments_used() == {}


S = "entries.auto.signals[0]"


@pytest.mark.parametrize("signal, error", [
    ({"name": "c", "type": "classifier", "deployment": "nope", "labels": ["x"]},
     f"{S}.deployment: unknown deployment 'nope' (deployments: intent, minilm, xenc)"),
    ({"name": "c", "type": "classifier", "deployment": "minilm", "labels": ["x"]},
     f"{S}.deployment: deployment 'minilm' serves embed; a classifier signal needs classify"),
    ({"name": "e", "type": "embedding", "deployment": "intent", "examples": ["x"]},
     f"{S}.deployment: deployment 'intent' serves classify; an embedding signal needs embed"),
    ({"name": "r", "type": "rerank", "deployment": "minilm", "examples": ["x"]},
     f"{S}.deployment: deployment 'minilm' serves embed; a rerank signal needs rerank or score"),
    ({"name": "d", "type": "domain", "deployment": "minilm", "domains": ["x"]},
     f"{S}.deployment: deployment 'minilm' serves embed; a domain signal needs classify"),
    ({"name": "d", "type": "domain", "deployment": "intent", "domains": ["x"], "examples": {"x": ["a"]}},
     f"{S}.deployment: deployment 'intent' serves classify; a domain signal (with examples) needs embed"),
    ({"name": "d", "type": "domain", "domains": ["x"]},
     f"{S}.deployment: required: a classify deployment, or `examples` ({{label: [texts]}}) to tell the domain "
     "by similarity"),
    ({"name": "d", "type": "domain", "domains": ["x", "y"], "examples": {"x": ["a"]}},
     f"{S}.domains[1]: unknown domain 'y' (labels of examples: x)"),
    ({"name": "d", "type": "domain", "domains": ["x"], "examples": {"x": []}},
     f"{S}.examples.x: expected a non-empty list, got an empty list"),
    ({"name": "c", "type": "classifier", "deployment": "intent"}, f"{S}.labels: required"),
    ({"name": "c", "type": "classifier", "deployment": "intent", "labels": ["x"], "threshold": 1.5},
     f"{S}.threshold: expected number in 0..1, got 1.5"),
    ({"name": "r", "type": "rerank", "examples": ["x"]}, f"{S}.deployment: required"),
    ({"name": "e", "type": "embedding", "examples": ["x"], "deployment": None},
     f"{S}.deployment: expected a non-empty string, got null"),
], ids=["unknown deployment", "classifier on embed", "embedding on classify", "rerank on embed",
        "domain on embed", "domain examples on classify", "domain with neither", "domain not a label",
        "empty examples", "classifier without labels", "threshold", "rerank without deployment",
        "null deployment"])
def test_signal_errors_name_the_key(signal: dict[str, Any], error: str) -> None:
    assert _errors(signal) == (error,)


def test_signal_budget_range() -> None:
    signal = {"name": "k", "type": "keyword", "keywords": ["x"]}
    assert _errors(signal, signal_budget_s=0) == ("entries.auto.signal_budget_s: expected number in 0..60, got 0",)


def test_a_deployment_named_by_a_number_is_an_error_not_a_crash() -> None:
    """YAML reads `deployments: {1: ...}` with an int key; a signal naming a deployment still checks."""
    config = _config({"name": "poem", "type": "embedding", "examples": ["x"], "deployment": "minilm"})
    config["deployments"] = {1: {"model": "m", "tasks": ["embed"], "attached": ATTACHED}}
    with pytest.raises(ConfigError) as info:
        parse_config(config)
    assert info.value.errors == ("deployments: expected names to be non-empty strings, got 1",
                                 f"{S}.deployment: unknown deployment 'minilm' (deployments: none defined)")
