"""The model runtime speaking the System One API to an attached deployment with `api: systemone`
(runtime/systemone_api.py through runtime/deployments.py), over a fake of the Upstream port: the body
sent, our own answer shape read back into the runtime's results with its usage, and answers of another
shape or family refused as the worker's fault."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from services.router.config import RouterConfig, parse_config
from services.router.runtime import pooling_api, systemone_api
from services.router.runtime.deployments import Deployments
from services.router.runtime.models import Label, ModelUnavailable
from tests.support.fake_upstream import FakeUpstream, Reply

A = "http://engine-router:8080"
T = TypeVar("T")
_SIGNALS = {"embed": {"type": "embedding", "examples": ["x"]}, "classify": {"type": "classifier", "labels": ["x"]},
            "rerank": {"type": "rerank", "examples": ["x"]}}


def _config(task: str) -> RouterConfig:
    config = parse_config({
        "listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://p:1"}]}},
        "entries": {"e": {"default": ["p"], "signals": [{"name": "s", "deployment": "d", **_SIGNALS[task]}],
                          "decisions": [{"name": "d", "when": "s", "pools": ["p"]}]}},
        "deployments": {"d": {"model": "remote-name", "tasks": [task], "attached": {"urls": [A], "api_key": "k"}}}},
        env={})
    # `attached.api` is read by the config reader (config/systemone.py); set here on the parsed config.
    d = config.deployments["d"]
    assert d.attached is not None
    attached = dataclasses.replace(d.attached, api="systemone")
    return dataclasses.replace(config, deployments={"d": dataclasses.replace(d, attached=attached)})


def _run(task: str, reply: Reply, body: Callable[[Deployments], Awaitable[T]]) -> tuple[T, FakeUpstream]:
    upstream = FakeUpstream()
    upstream.answer(A, reply)

    async def go() -> T:
        runtime = Deployments(_config(task), upstream)
        await runtime.start()
        try:
            await runtime.wait_ready()
            return await body(runtime)
        finally:
            await runtime.stop()

    return asyncio.run(go()), upstream


def _json(value: object) -> Reply:
    return Reply(chunks=(json.dumps(value).encode(),))


def test_classify_asks_the_system_one_api_and_takes_the_servers_class_names() -> None:
    answer = {"object": "systemone.classification", "model": "remote-name", "family": "classifier",
              "data": [{"index": 1, "label": "neg", "probability": 0.8, "probs": {"pos": 0.2, "neg": 0.8}},
                       {"index": 0, "label": "pos", "probability": 0.6, "probs": {"pos": 0.6, "neg": 0.4},
                        "stage": "fast", "judged": False}],
              "usage": {"prompt_tokens": 12, "total_tokens": 12}, "deployment": "x", "routing": None}
    out, upstream = _run("classify", _json(answer), lambda rt: rt.classify("d", ["a", "b"], timeout_s=5))
    assert out.results == [Label("pos", 0.6, {"pos": 0.6, "neg": 0.4}), Label("neg", 0.8, {"pos": 0.2, "neg": 0.8})]
    assert out.prompt_tokens == 12 and out.worker == A
    [sent] = upstream.sent
    assert (sent.path, sent.body, sent.api_key) == ("/v1/systemone", {"model": "remote-name", "input": ["a", "b"]}, "k")


def test_embed_and_rerank_ask_it_too() -> None:
    vectors = {"object": "systemone.embedding", "data": [{"index": 0, "embedding": [0.6, 0.8]}],
               "usage": {"prompt_tokens": 2, "total_tokens": 2}}
    out, upstream = _run("embed", _json(vectors), lambda rt: rt.embed("d", ["a"], timeout_s=5))
    assert out.vectors == [[0.6, 0.8]] and out.prompt_tokens == 2
    assert upstream.sent[0].body == {"model": "remote-name", "input": ["a"]}
    scores = {"object": "systemone.scores", "data": [{"index": 1, "score": 0.1}, {"index": 0, "score": 0.9}]}
    ranked, upstream = _run("rerank", _json(scores), lambda rt: rt.rerank("d", "q", ["x", "y"], timeout_s=5))
    assert ranked.scores == [0.9, 0.1] and ranked.prompt_tokens == 0
    assert upstream.sent[0].body == {"model": "remote-name", "query": "q", "documents": ["x", "y"]}


@pytest.mark.parametrize(("answer", "says"), [
    ({"object": "systemone.embedding", "data": []}, "object: expected 'systemone.classification' (a classifier model)"),
    ({"object": "systemone.classification", "data": [{"index": 0, "label": "c", "probability": 1.0,
                                                       "probs": {"a": 1.0}}]}, "data[0].label: expected one of"),
    ({"object": "systemone.classification", "data": [{"index": 0, "label": "a", "probability": 0.5,
                                                       "probs": {"a": 1.0}}]}, "data[0].probability: expected"),
    ({"object": "systemone.classification", "data": [{"index": 0, "label": "a", "probability": 1.0,
                                                       "probs": {"a": "x"}}]}, "data[0].probs: expected an object"),
])
def test_an_answer_not_of_the_apis_shape_is_the_workers_fault(answer: dict[str, Any], says: str) -> None:
    async def call(rt: Deployments) -> str:
        with pytest.raises(ModelUnavailable) as info:
            await rt.classify("d", ["a"], timeout_s=5)
        assert info.value.status == 502
        return str(info.value)

    reason, _ = _run("classify", _json(answer), call)
    assert "a body that is not the System One API's" in reason and says in reason


def test_the_readers_check_each_row() -> None:
    with pytest.raises(pooling_api.BadAnswer, match=r"data\[0\].score"):
        systemone_api.relevance({"object": "systemone.scores", "data": [{"index": 0, "score": None}]}, 1)
    with pytest.raises(pooling_api.BadAnswer, match="data: expected 2 rows"):
        systemone_api.embeddings({"object": "systemone.embedding", "data": [{"index": 0, "embedding": [1.0]}]}, 2)


def test_usage_is_read_from_the_key_each_pooling_call_names() -> None:
    assert pooling_api.classify_call("m", ["x"]).usage == pooling_api.embed_call("m", ["x"]).usage == "prompt_tokens"
    assert pooling_api.rerank_call("m", "q", ["d"]).usage == "total_tokens"
    assert pooling_api.tokens({"usage": {"prompt_tokens": 7}}, "prompt_tokens") == 7
    assert [pooling_api.tokens(answer, "prompt_tokens") for answer in (
        {}, {"usage": None}, {"usage": {"prompt_tokens": -1}}, {"usage": {"prompt_tokens": True}},
        {"usage": {"prompt_tokens": 1.5}})] == [0] * 5


def test_a_system_one_call_to_the_pooling_api_asks_for_no_truncation() -> None:
    assert "truncate_prompt_tokens" not in pooling_api.classify_call("m", ["x"], truncate=False).body
    assert "truncate_prompt_tokens" not in pooling_api.rerank_call("m", "q", ["d"], truncate=False).body
    assert pooling_api.embed_call("m", ["x"]).body["truncate_prompt_tokens"] == -1  # signals keep cutting
