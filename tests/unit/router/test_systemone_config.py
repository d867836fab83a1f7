"""The router config's System One keys (config/systemone.py): a listener's apis mapping, published
models and pools, pools' outputs, native recipes (stages, budget, accept, judge), the chat escalate's
judge, attached System One deployments; what they build, every problem by its key path, and which
deployments they start (runtime/demand.py) and which chat models a listener serves."""
from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.router.config import (
    AttachedConfig,
    Budget,
    ConfidenceAccept,
    ConfigError,
    DecisionRule,
    EntryConfig,
    EscalateAlgorithm,
    JudgeConfig,
    KeywordSignal,
    ListenerConfig,
    NativeEscalateAlgorithm,
    SignalRef,
    parse_config,
)
from services.router.listeners.listener import listeners_by_port
from services.router.runtime.demand import used_deployments

BASE = yaml.safe_load(r"""
listeners:
  - name: public
    port: 8080
    api_keys: [k1]
    apis: {chat: {}, models: {}, systemone: {models: [triage, intent]}}
    pools: [painter, big]
  - {name: ops, host: 127.0.0.1, port: 8081, apis: [chat, models, decisions]}
pools:
  small: {model: qwen-small, replicas: [{url: "http://a:8000"}]}
  big: {model: qwen-big, replicas: [{url: "http://b:8000"}]}
  painter: {model: sdxl, replicas: [{url: "http://c:8000"}], outputs: [image]}
deployments:
  intent: {model: tiny-classifier, tasks: [classify], managed: {backend: sim}}
  intent-large:
    model: big-classifier
    tasks: [classify]
    attached: {urls: ["http://engine.internal:8080"], api: systemone}
  reranker: {model: tiny-cross-encoder, tasks: [rerank, score], attached: {urls: ["http://r:1"]}}
  embedder: {model: minilm, tasks: [embed], managed: {}}
entries:
  auto:
    signals: [{name: code, type: keyword, keywords: [def]}]
    decisions: [{name: coding, when: code, pools: [big]}]
    default: [small]
    algorithm: {type: escalate, stages: [small, big], judge: {pool: big, timeout_s: 2}}
  triage:
    api: systemone
    signals: [{name: urgent, type: keyword, keywords: [urgent]}]
    decisions:
      - {name: fast-only, when: urgent, stages: [intent], budget: {deadline_s: 0.5}}
    default: [intent, intent-large]
    algorithm: {accept: {min_probability: 0.8, min_margin: 0.2}, judge: {pool: big}}
    budget: {deadline_s: 2, max_calls: 3}
""")


def _config(edit: Callable[[dict[str, Any]], object] = lambda d: None) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    edit(data)
    return data


def _errors(edit: Callable[[dict[str, Any]], object]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(edit), "router.yaml", env={})
    return info.value.errors


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return d["listeners"][0]  # type: ignore[no-any-return]


def _triage(d: dict[str, Any]) -> dict[str, Any]:
    return d["entries"]["triage"]  # type: ignore[no-any-return]


def _auto(d: dict[str, Any]) -> dict[str, Any]:
    return d["entries"]["auto"]  # type: ignore[no-any-return]


def test_the_full_example_builds_every_object() -> None:
    config = parse_config(_config(), env={})
    assert config.listeners == (
        ListenerConfig("public", 8080, "0.0.0.0", ("k1",), ("chat", "models", "systemone"), (),
                       ("triage", "intent"), ("painter", "big")),
        # `decisions` in a list of apis is the routing preview's old name: explain.
        ListenerConfig("ops", 8081, "127.0.0.1", (), ("chat", "models", "explain")))
    assert config.pools["painter"].outputs == ("image",)
    assert config.pools["small"].outputs == ("text",)  # the default
    assert config.deployments["intent-large"].attached == AttachedConfig(("http://engine.internal:8080",), None,
                                                                         "systemone")
    assert config.deployments["reranker"].attached == AttachedConfig(("http://r:1",))  # api: pooling
    assert config.deployments["reranker"].attached.api == "pooling"  # type: ignore[union-attr]
    assert config.entries["auto"].algorithm == EscalateAlgorithm(("small", "big"), judge=JudgeConfig("big", 2.0))
    assert config.entries["triage"] == EntryConfig(
        name="triage", default=("intent", "intent-large"),
        signals=(KeywordSignal("urgent", ("urgent",)),),
        decisions=(DecisionRule("fast-only", SignalRef("urgent"), ("intent",), Budget(0.5, 3)),),
        algorithm=NativeEscalateAlgorithm(ConfidenceAccept(0.8, 0.2), JudgeConfig("big", 10.0)),
        api="systemone", budget=Budget(2.0, 3))
    assert config.entries["triage"].native and not config.entries["auto"].native
    assert (config.chat_entries, config.native_entries) == (("auto",), ("triage",))


def test_the_defaults_of_a_native_recipe() -> None:
    config = parse_config(_config(lambda d: d["entries"].update(
        triage={"api": "systemone", "default": ["reranker"]})), env={})
    triage = config.entries["triage"]
    assert triage == EntryConfig("triage", ("reranker",), algorithm=NativeEscalateAlgorithm(), api="systemone",
                                 budget=Budget())
    assert triage.algorithm == NativeEscalateAlgorithm(ConfidenceAccept(0.0, 0.0), None)
    assert triage.budget == Budget(10.0, 3)


def test_a_decision_budget_may_leave_out_what_it_does_not_tighten() -> None:
    config = parse_config(_config(lambda d: _triage(d)["decisions"][0].update(budget={"max_calls": 1})), env={})
    assert config.entries["triage"].decisions[0].budget == Budget(2.0, 1)  # the entry's deadline
    config = parse_config(_config(lambda d: _triage(d)["decisions"][0].update(
        budget={"deadline_s": 2, "max_calls": 3})), env={})
    assert config.entries["triage"].decisions[0].budget == Budget(2.0, 3)  # equal is no loosening


def test_a_listener_serves_only_chat_entries_as_chat_models() -> None:
    config = parse_config(_config(), env={})
    listeners = listeners_by_port(config)
    # No `entries` allowlist: every chat entry, and never a native recipe.
    assert listeners[8080].entries == ("auto",) and listeners[8081].entries == ("auto",)


def test_used_deployments_counts_published_models_and_native_stages() -> None:
    config = parse_config(_config(), env={})
    assert used_deployments(config) == {
        "intent": ["stage of entries.triage", "published as a System One model on listener public"],
        "intent-large": ["stage of entries.triage"]}


def test_a_deployment_published_and_named_by_a_signal_keeps_both_reasons() -> None:
    def edit(d: dict[str, Any]) -> None:
        _public(d)["apis"]["systemone"]["models"] = ["reranker"]
        _auto(d)["signals"].append({"name": "topic", "type": "rerank", "deployment": "reranker",
                                    "examples": ["x"]})
        _auto(d)["decisions"].append({"when": "topic", "pools": ["small"]})
        del d["entries"]["triage"]
    assert used_deployments(parse_config(_config(edit), env={})) == {
        "reranker": ["signal entries.auto.signals[1] (topic, rerank)",
                     "published as a System One model on listener public"]}


def test_every_problem_is_reported_at_once() -> None:
    def edit(d: dict[str, Any]) -> None:
        _public(d)["apis"]["systemone"]["models"] = ["nope"]
        _triage(d)["budget"] = {"max_calls": 0}
        d["pools"]["painter"]["outputs"] = ["video"]
    assert _errors(edit) == (
        "pools.painter.outputs[0]: unknown output 'video' (outputs: text, image)",
        "entries.triage.budget.max_calls: expected integer >= 1, got 0",
        "listeners[0].apis.systemone.models[0]: unknown System One model 'nope' (deployments: intent, "
        "intent-large, reranker, embedder; native entries: triage)")


INVALID: dict[str, tuple[Callable[[dict[str, Any]], object], tuple[str, ...]]] = {
    # ---- listeners[].apis ----
    "systemone in a list of apis": (
        lambda d: _public(d).update(apis=["chat", "systemone"]),
        ("listeners[0].apis[1]: systemone is published with its models: write apis as a mapping, e.g. "
         "{chat: {}, models: {}, systemone: {models: [NAME, ...]}}",)),
    "an unknown api in a list": (
        lambda d: _public(d).update(apis=["chat", "embeddings"], pools=[]),
        ("listeners[0].apis[1]: unknown api 'embeddings' (apis: chat, completions, responses, messages, models, "
         "explain, images, systemone, memory)",)),
    "an unknown api in a mapping": (
        lambda d: _public(d)["apis"].update(chats={}),
        ("listeners[0].apis.chats: unknown api 'chats' (apis: chat, completions, responses, messages, models, "
         "explain, images, systemone, memory)",)),
    "decisions as a mapping key": (
        lambda d: _public(d)["apis"].update(decisions={}),
        ("listeners[0].apis.decisions: ambiguous: write `explain` for the routing preview (POST "
         "/v1/router/explain), or `systemone` for the System One API (POST /v1/decisions is its alias)",)),
    "options on an api that takes none": (
        lambda d: _public(d)["apis"].update(chat={"models": ["x"]}),
        ("listeners[0].apis.chat: chat takes no options: write `chat: {}` (only systemone has options: "
         "{models: [NAME, ...]})",)),
    "systemone without options": (
        lambda d: _public(d)["apis"].update(systemone=None),
        ("listeners[0].apis.systemone: expected {models: [NAME, ...]}, the deployments and native entries "
         "(api: systemone) this listener publishes; got null",)),
    "systemone without models": (
        lambda d: _public(d)["apis"].update(systemone={}),
        ("listeners[0].apis.systemone.models: required",)),
    "systemone with no model": (
        lambda d: _public(d)["apis"].update(systemone={"models": []}),
        ("listeners[0].apis.systemone.models: expected a non-empty list, got an empty list",)),
    "systemone with an unknown option": (
        lambda d: _public(d)["apis"]["systemone"].update(model="intent"),
        ("listeners[0].apis.systemone.model: unknown key; allowed: models (did you mean 'models'?)",)),
    "a model published twice": (
        lambda d: _public(d)["apis"]["systemone"].update(models=["intent", "intent"]),
        ("listeners[0].apis.systemone.models[1]: duplicate model 'intent'",)),
    "an empty apis mapping": (
        lambda d: _public(d).update(apis={}),
        ("listeners[0].apis: expected a non-empty list of apis, or a mapping such as {chat: {}, models: {}, "
         "systemone: {models: [NAME, ...]}}; got an empty mapping",)),
    "apis neither a list nor a mapping": (
        lambda d: _public(d).update(apis="chat"),
        ("listeners[0].apis: expected a non-empty list of apis, or a mapping such as {chat: {}, models: {}, "
         "systemone: {models: [NAME, ...]}}; got 'chat'",)),
    # ---- published System One models ----
    "an unknown published model": (
        lambda d: _public(d)["apis"]["systemone"].update(models=["intent", "intnet"]),
        ("listeners[0].apis.systemone.models[1]: unknown System One model 'intnet' (deployments: intent, "
         "intent-large, reranker, embedder; native entries: triage)",)),
    "a chat entry published as a System One model": (
        lambda d: _public(d)["apis"]["systemone"].update(models=["auto"]),
        ("listeners[0].apis.systemone.models[0]: 'auto' is a chat entry; System One publishes deployments and "
         "native entries (api: systemone)",)),
    "a published name that is a deployment and a native entry": (
        lambda d: d["entries"].update(intent={"api": "systemone", "default": ["intent"]}),
        ("listeners[0].apis.systemone.models[1]: 'intent' is both a deployment and a native entry: rename one",)),
    "no deployment and no native entry to publish": (
        lambda d: (d.pop("deployments"), d["entries"].pop("triage")),
        ("listeners[0].apis.systemone.models[0]: unknown System One model 'triage' (deployments: none defined; "
         "native entries: none defined)",
         "listeners[0].apis.systemone.models[1]: unknown System One model 'intent' (deployments: none defined; "
         "native entries: none defined)")),
    # ---- listeners[].entries: chat entries only ----
    "a native entry in a listener's chat allowlist": (
        lambda d: _public(d).update(entries=["auto", "triage"]),
        ("listeners[0].entries[1]: 'triage' is a native System One recipe (api: systemone), not a chat model: "
         "publish it under apis.systemone.models",)),
    "an unknown entry lists the chat entries": (
        lambda d: _public(d).update(entries=["autp"]),
        ("listeners[0].entries[0]: unknown entry 'autp' (entries: auto)",)),
    # ---- listeners[].pools ----
    "an unknown published pool": (
        lambda d: _public(d).update(pools=["big", "bgi"]),
        ("listeners[0].pools[1]: unknown pool 'bgi' (pools: small, big, painter)",)),
    "a pool published twice": (
        lambda d: _public(d).update(pools=["big", "big"]),
        ("listeners[0].pools[1]: duplicate pool 'big'",)),
    "a published pool that is a chat entry served there": (
        lambda d: d["entries"].update(big={"default": ["big"]}),
        ("listeners[0].pools[1]: 'big' is also a chat entry served on this listener (one name, two meanings): "
         "rename one, or leave it out of this listener's entries",)),
    "published pools with no api to serve them": (
        lambda d: _public(d).update(apis={"models": {}, "systemone": {"models": ["intent"]}}),
        ("listeners[0].pools: nothing would serve them: published pools are served by the chat, completions, "
         "responses, messages, images apis, and this listener has none (apis: models, systemone)",)),
    "published pools not a list": (
        lambda d: _public(d).update(pools="big"),
        ("listeners[0].pools: expected a list, got 'big'",)),
    # ---- pools.X.outputs ----
    "an unknown output": (
        lambda d: d["pools"]["painter"].update(outputs=["image", "video"]),
        ("pools.painter.outputs[1]: unknown output 'video' (outputs: text, image)",)),
    "no output": (
        lambda d: d["pools"]["painter"].update(outputs=[]),
        ("pools.painter.outputs: expected a non-empty list, got an empty list",)),
    # ---- entries.X.api ----
    "an unknown entry api": (
        lambda d: _triage(d).update(api="native"),
        ("entries.triage.api: unknown api 'native' (apis: chat, systemone)",)),
    "an entry with an unknown api is only refused where it is read": (
        lambda d: (_triage(d).update(api="native"), _public(d)["apis"]["systemone"].update(models=["triage", "x"]),
                   _public(d).update(entries=["triage"])),
        ("entries.triage.api: unknown api 'native' (apis: chat, systemone)",
         "listeners[0].apis.systemone.models[1]: unknown System One model 'x' (deployments: intent, intent-large, "
         "reranker, embedder; native entries: none defined)")),
    # ---- chat entries: the escalate's judge, no budget ----
    "a chat judge on an unknown pool": (
        lambda d: _auto(d)["algorithm"]["judge"].update(pool="bog"),
        ("entries.auto.algorithm.judge.pool: unknown pool 'bog' (pools: small, big, painter)",)),
    "a chat judge on an image pool": (
        lambda d: _auto(d)["algorithm"]["judge"].update(pool="painter"),
        ("entries.auto.algorithm.judge.pool: pool 'painter' has outputs image; a judge is a chat pool with text "
         "output (pools with it: small, big)",)),
    "a chat judge without a pool": (
        lambda d: _auto(d)["algorithm"].update(judge={"timeout_s": 1}),
        ("entries.auto.algorithm.judge.pool: required",)),
    "a chat judge with no time": (
        lambda d: _auto(d)["algorithm"]["judge"].update(timeout_s=0),
        ("entries.auto.algorithm.judge.timeout_s: expected number > 0, got 0",)),
    "a judge on a static algorithm": (
        lambda d: _auto(d).update(algorithm={"type": "static", "judge": {"pool": "big"}}),
        ("entries.auto.algorithm.judge: unknown key; allowed: type",)),
    "a budget on a chat entry": (
        lambda d: _auto(d).update(budget={"deadline_s": 1}),
        ("entries.auto.budget: only for api: systemone entries (a chat escalate's deadline and call cap are "
         "algorithm.deadline_s and algorithm.max_calls)",)),
    "a budget on a chat decision": (
        lambda d: _auto(d)["decisions"][0].update(budget={"deadline_s": 1}),
        ("entries.auto.decisions[0].budget: only for api: systemone entries (a chat escalate's deadline and call "
         "cap are algorithm.deadline_s and algorithm.max_calls)",)),
    # ---- native entries ----
    "a native entry without default": (
        lambda d: _triage(d).pop("default"),
        ("entries.triage.default: required",)),
    "a native entry with no stage": (
        lambda d: _triage(d).update(default=[]),
        ("entries.triage.default: expected a non-empty list, got an empty list",)),
    "a native stage that is a pool": (
        lambda d: _triage(d).update(default=["intent", "small"]),
        ("entries.triage.default[1]: unknown deployment 'small' (deployments: intent, intent-large, reranker, "
         "embedder)",)),
    "an unknown native entry key": (
        lambda d: _triage(d).update(stages=["intent"]),
        ("entries.triage.stages: unknown key; allowed: api, signals, projections, decisions, default, algorithm, "
         "budget, signal_budget_s",)),
    "pools in a native decision": (
        lambda d: _triage(d)["decisions"][0].update(pools=["intent"]),
        ("entries.triage.decisions[0].pools: a native recipe's candidates are deployments, its escalate stages: "
         "write `stages: [DEPLOYMENT, ...]`, the fast one first",)),
    "pools instead of stages in a native decision": (
        lambda d: _triage(d).update(decisions=[{"when": "urgent", "pools": ["intent"]}]),
        ("entries.triage.decisions[0].pools: a native recipe's candidates are deployments, its escalate stages: "
         "write `stages: [DEPLOYMENT, ...]`, the fast one first",)),
    "an unknown stage in a native decision": (
        lambda d: _triage(d)["decisions"][0].update(stages=["intnet"]),
        ("entries.triage.decisions[0].stages[0]: unknown deployment 'intnet' (deployments: intent, intent-large, "
         "reranker, embedder)",)),
    "a native decision without when": (
        lambda d: _triage(d)["decisions"][0].pop("when"),
        ("entries.triage.decisions[0].when: required",)),
    "a native decision's when naming an unknown signal": (
        lambda d: _triage(d)["decisions"][0].update(when="urgnet"),
        ("entries.triage.decisions[0].when: unknown signal 'urgnet' (signals: urgent)",)),
    "a decision budget that loosens the deadline": (
        lambda d: _triage(d)["decisions"][0].update(budget={"deadline_s": 5}),
        ("entries.triage.decisions[0].budget.deadline_s: a decision's budget may only tighten the entry's: 5 > "
         "the entry's budget.deadline_s 2",)),
    "a decision budget that loosens the call cap": (
        lambda d: _triage(d)["decisions"][0].update(budget={"max_calls": 4}),
        ("entries.triage.decisions[0].budget.max_calls: a decision's budget may only tighten the entry's: 4 > "
         "the entry's budget.max_calls 3",)),
    "a decision budget that loosens the default one": (
        lambda d: (_triage(d).pop("budget"), _triage(d)["decisions"][0].update(budget={"deadline_s": 10.5})),
        ("entries.triage.decisions[0].budget.deadline_s: a decision's budget may only tighten the entry's: 10.5 "
         "> the entry's budget.deadline_s 10",)),
    "a stage named twice": (
        lambda d: _triage(d).update(default=["intent", "intent-large", "intent"]),
        ("entries.triage.default[2]: duplicate stage 'intent': a stage is asked once (a model answers the same "
         "input the same way)",)),
    "a call cap the signals use up": (
        lambda d: _triage(d).update(
            signals=[{"name": "topic", "type": "classifier", "deployment": "intent", "labels": ["code"]}],
            decisions=[{"name": "coding", "when": "topic", "stages": ["intent"], "budget": {"max_calls": 1}}]),
        ("entries.triage.decisions[0].budget.max_calls: 1 leaves no stage call: the signals ask 1 deployment(s) "
         "(intent) first, and each call counts against it",)),
    "a judge with no calls": (
        lambda d: _triage(d)["algorithm"]["judge"].update(max_calls=0),
        ("entries.triage.algorithm.judge.max_calls: expected integer >= 1, got 0",)),
    "a decision budget with an unknown key": (
        lambda d: _triage(d)["decisions"][0].update(budget={"deadline": 1}),
        ("entries.triage.decisions[0].budget.deadline: unknown key; allowed: deadline_s, max_calls",)),
    "a zero deadline": (
        lambda d: _triage(d).update(budget={"deadline_s": 0}),
        ("entries.triage.budget.deadline_s: expected number > 0, got 0",)),
    "no call allowed": (
        lambda d: _triage(d).update(budget={"max_calls": 0}),
        ("entries.triage.budget.max_calls: expected integer >= 1, got 0",)),
    "a budget not a mapping": (
        lambda d: _triage(d).update(budget=2),
        ("entries.triage.budget: expected mapping, got 2",)),
    "a native algorithm of another type": (
        lambda d: _triage(d)["algorithm"].update(type="static"),
        ("entries.triage.algorithm.type: a native recipe escalates over its stages: expected escalate (or leave "
         "type out), got 'static'",)),
    "a chat escalate's stages on a native algorithm": (
        lambda d: _triage(d)["algorithm"].update(type="escalate", stages=["intent"], max_calls=2),
        ("entries.triage.algorithm.stages: not here: a native recipe's stages are its decisions' `stages` and "
         "its `default`",
         "entries.triage.algorithm.max_calls: not here: a native recipe's call cap is the entry's "
         "`budget.max_calls`")),
    "a chat escalate's deadline on a native algorithm": (
        lambda d: _triage(d)["algorithm"].update(deadline_s=1),
        ("entries.triage.algorithm.deadline_s: not here: a native recipe's deadline is the entry's "
         "`budget.deadline_s`",)),
    "a chat escalate's accept on a native algorithm": (
        lambda d: _triage(d)["algorithm"].update(accept={"min_chars": 3}),
        ("entries.triage.algorithm.accept.min_chars: unknown key; allowed: min_probability, min_margin",)),
    "a probability above 1": (
        lambda d: _triage(d)["algorithm"]["accept"].update(min_probability=1.5),
        ("entries.triage.algorithm.accept.min_probability: expected number in 0..1, got 1.5",)),
    "a negative margin": (
        lambda d: _triage(d)["algorithm"]["accept"].update(min_margin=-0.1),
        ("entries.triage.algorithm.accept.min_margin: expected number in 0..1, got -0.1",)),
    "a native judge on an image pool": (
        lambda d: _triage(d)["algorithm"]["judge"].update(pool="painter"),
        ("entries.triage.algorithm.judge.pool: pool 'painter' has outputs image; a judge is a chat pool with "
         "text output (pools with it: small, big)",)),
    "a native judge on a deployment": (
        lambda d: _triage(d)["algorithm"]["judge"].update(pool="intent-large"),
        ("entries.triage.algorithm.judge.pool: unknown pool 'intent-large' (pools: small, big, painter)",)),
    "stages of two families": (
        lambda d: _triage(d).update(default=["intent", "reranker"]),
        ("entries.triage.default[1]: deployment 'reranker' is a cross_encoder, but 'intent' "
         "(entries.triage.decisions[0].stages[0]) is a classifier: a native recipe's stages are all of one "
         "family",)),
    "an embedding stage": (
        lambda d: _triage(d)["decisions"][0].update(stages=["embedder"]),
        ("entries.triage.decisions[0].stages[0]: deployment 'embedder' is an embedding model: it has no "
         "confidence to escalate on; a native recipe's stages are classifiers or cross-encoders",)),
    "a native signal naming an unknown deployment": (
        lambda d: _triage(d)["signals"].append({"name": "topic", "type": "classifier", "deployment": "topic",
                                                "labels": ["x"]}),
        ("entries.triage.signals[1].deployment: unknown deployment 'topic' (deployments: intent, intent-large, "
         "reranker, embedder)",)),
    # ---- deployments.X.attached.api ----
    "an unknown attached api": (
        lambda d: d["deployments"]["intent-large"]["attached"].update(api="openai"),
        ("deployments.intent-large.attached.api: unknown api 'openai' (apis: pooling, systemone)",)),
}


@pytest.mark.parametrize("edit, errors", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_system_one_key_is_refused_naming_it(edit: Callable[[dict[str, Any]], object],
                                                        errors: tuple[str, ...]) -> None:
    assert _errors(edit) == errors


def test_a_broken_stage_deployment_skips_the_family_check_only() -> None:
    # `reranker` is too broken to build (no tasks): still declared, so no "unknown deployment" and no
    # family error; its own error is the only one.
    assert _errors(lambda d: (d["deployments"]["reranker"].pop("tasks"),
                              _triage(d).update(default=["intent", "reranker"]))) == (
        "deployments.reranker.tasks: required",)


def test_a_cross_encoder_recipe_is_accepted() -> None:
    config = parse_config(_config(lambda d: (_triage(d).update(default=["reranker"]),
                                             _triage(d)["decisions"][0].update(stages=["reranker"]))), env={})
    assert config.entries["triage"].default == ("reranker",)


def test_a_listener_that_only_publishes_system_one() -> None:
    config = parse_config(_config(lambda d: _public(d).update(apis={"systemone": {"models": ["triage"]}},
                                                              pools=[])), env={})
    assert (config.listeners[0].apis, config.listeners[0].systemone) == (("systemone",), ("triage",))


def test_a_pool_published_on_a_listener_that_does_not_serve_the_same_named_entry() -> None:
    # `big` is a chat entry and a pool: fine where the entry is not served (the allowlist leaves it out).
    config = parse_config(_config(lambda d: (d["entries"].update(big={"default": ["big"]}),
                                             _public(d).update(entries=["auto"]))), env={})
    assert config.listeners[0].pools == ("painter", "big")


def test_null_options_count_as_none() -> None:
    config = parse_config(_config(lambda d: _public(d)["apis"].update(chat=None, explain=None)), env={})
    assert config.listeners[0].apis == ("chat", "models", "systemone", "explain")


def test_the_documented_example_loads_with_its_native_recipe_and_published_models() -> None:
    text = (Path(__file__).parents[3] / "docs" / "router-config.md").read_text()
    example = text.split("\n## Example\n", 1)[1]
    config = parse_config(yaml.safe_load(example.split("```yaml\n", 1)[1].split("\n```", 1)[0]),
                          env={"ROUTER_KEYS": "k"})
    assert config.listeners[0].systemone == ("intent", "triage") and config.listeners[0].pools == ("painter",)
    assert config.entries["triage"].native and config.pools["painter"].outputs == ("image",)
    assert used_deployments(config)["intent-large"] == ["stage of entries.triage"]


def test_a_judge_caps_its_calls_per_request() -> None:
    config = parse_config(_config(lambda d: _triage(d)["algorithm"]["judge"].update(max_calls=2)), env={})
    algorithm = config.entries["triage"].algorithm
    assert isinstance(algorithm, NativeEscalateAlgorithm) and algorithm.judge is not None
    assert algorithm.judge.max_calls == 2
    default = parse_config(_config(), env={}).entries["triage"].algorithm
    assert isinstance(default, NativeEscalateAlgorithm) and default.judge is not None
    assert default.judge.max_calls == JudgeConfig("p").max_calls == 4
