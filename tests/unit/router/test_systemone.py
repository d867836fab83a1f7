"""The System One API of the router's listeners (listeners/systemone.py, app.py) over a fake of the
Upstream port: which listener serves which names (a name not published answers exactly as an unknown
one), each family's answer from what its worker said (usage included), every body check a 400 naming
the field, every way a call cannot be answered with its status, and a native recipe's result formatted."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import (
    Budget,
    EntryConfig,
    NativeEscalateAlgorithm,
    RouterConfig,
    parse_config,
)
from services.router.decision import native
from services.router.decision.engine import Router
from services.router.decision.native import ItemResult, NativeInput, RecipeResult, StageOutput
from services.router.listeners.systemone import recipe_answer
from services.router.metrics import RouterMetrics
from services.router.runtime.deployments import Deployments
from services.router.runtime.models import Label
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply

CLS, EMB, RR, IDLE = "http://cls:8000", "http://emb:8000", "http://rr:8000", "http://idle:8000"
KEY = {"authorization": "Bearer k"}
T = TypeVar("T")


def _config(**deployment_extra: Any) -> RouterConfig:
    """Three attached deployments, one per family, each used by a signal (so the runtime starts it);
    listener 8080 publishes them and a native recipe behind a key, 8081 serves chat only."""
    signals = [{"name": "c", "type": "classifier", "deployment": "cls", "labels": ["x"]},
               {"name": "e", "type": "embedding", "deployment": "emb", "examples": ["x"]},
               {"name": "r", "type": "rerank", "deployment": "rr", "examples": ["x"]}]
    worker = {"health": {"interval_s": 60}, **deployment_extra}
    config = parse_config({
        "listeners": [{"port": 8080, "api_keys": ["k"]}, {"port": 8081, "name": "chat"}],
        "pools": {"p": {"model": "m", "replicas": [{"url": "http://p:8000"}]}},
        "entries": {"e": {"default": ["p"], "signals": signals,
                          "decisions": [{"name": "d", "when": {"any": ["c", "e", "r"]}, "pools": ["p"]}]}},
        "deployments": {
            "cls": {"model": "cls-m", "tasks": ["classify"], "labels": ["a", "b"],
                    "attached": {"urls": [CLS]}, **worker},
            "emb": {"model": "emb-m", "tasks": ["embed"], "attached": {"urls": [EMB]}, **worker},
            "rr": {"model": "rr-m", "tasks": ["rerank"], "attached": {"urls": [RR]}, **worker},
            "idle": {"model": "idle-m", "tasks": ["classify"], "labels": ["a"], "attached": {"urls": [IDLE]}}}},
        env={})
    recipe = EntryConfig("recipe", ("cls",), api="systemone", algorithm=NativeEscalateAlgorithm(), budget=Budget())
    public = dataclasses.replace(config.listeners[0], apis=(*config.listeners[0].apis, "systemone"),
                                 systemone=("cls", "emb", "rr", "recipe", "idle"))
    return dataclasses.replace(config, listeners=(public, config.listeners[1]),
                               entries={**config.entries, "recipe": recipe})


def _json(value: object, status: int = 200) -> Reply:
    return Reply(status=status, chunks=(json.dumps(value).encode(),))


def _usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": n, "total_tokens": n}


def _serve(upstream: FakeUpstream, body: Callable[[RouterApp], Awaitable[T]], config: RouterConfig | None = None) -> T:
    config = config or _config()
    plain = dataclasses.replace(config, entries={"e": EntryConfig("e", ("p",))})  # no signal evaluated here
    pools = build_pools(config)

    async def go() -> T:
        runtime = Deployments(config, upstream)
        app = RouterApp(config, Router(plain), pools, upstream, RouterMetrics(pools), runtime=runtime)
        await runtime.start()
        try:
            await runtime.wait_ready()
            return await body(app)
        finally:
            await runtime.stop()
            app.close()

    return asyncio.run(go())


def _post(body: Any, path: str = "/v1/systemone", *, port: int = 8080,
          headers: dict[str, str] | None = None, upstream: FakeUpstream | None = None) -> Answer:
    return _serve(upstream or FakeUpstream(),
                  lambda app: request(app, "POST", path, body, port=port, headers=KEY if headers is None else headers))


# ---- each family's answer ----

def test_a_classifier_answers_every_class_by_name_with_the_workers_usage_and_the_input_never_cut() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, _json({"data": [{"index": 1, "label": "LABEL_0", "probs": [0.9, 0.1]},
                                         {"index": 0, "label": "LABEL_1", "probs": [0.3, 0.7]}], "usage": _usage(11)}))
    answer = _post({"model": "cls", "input": ["x", "y"], "user": "u-1"}, upstream=upstream)
    assert answer.status == 200, answer.body
    assert answer.json() == {
        "object": "systemone.classification", "model": "cls", "family": "classifier",
        "data": [{"index": 0, "label": "b", "probability": 0.7, "probs": {"a": 0.3, "b": 0.7}},
                 {"index": 1, "label": "a", "probability": 0.9, "probs": {"a": 0.9, "b": 0.1}}],
        "usage": {"prompt_tokens": 11, "total_tokens": 11}, "deployment": "cls", "routing": None}
    [sent] = upstream.sent
    # No truncation asked: a text past the context is the worker's 400, not an answer about part of it.
    assert (sent.url, sent.path, sent.body) == (CLS, "/classify", {"model": "cls-m", "input": ["x", "y"]})


def test_an_embedding_model_answers_vectors_and_a_lone_string_is_a_batch_of_one() -> None:
    upstream = FakeUpstream()
    upstream.answer(EMB, _json({"data": [{"index": 0, "embedding": [0.6, 0.8]}], "usage": _usage(3)}))
    answer = _post({"model": "emb", "input": "hello"}, upstream=upstream)
    assert answer.json() == {"object": "systemone.embedding", "model": "emb", "family": "embedding",
                             "data": [{"index": 0, "embedding": [0.6, 0.8]}], "usage": _usage(3),
                             "deployment": "emb", "routing": None}
    assert upstream.sent[0].body == {"model": "emb-m", "input": ["hello"], "encoding_format": "float"}


def test_a_cross_encoder_answers_scores_in_document_order_with_reranks_total_tokens() -> None:
    upstream = FakeUpstream()
    upstream.answer(RR, _json({"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.2}],
                               "usage": {"total_tokens": 17}}))
    answer = _post({"model": "rr", "query": "q", "documents": ["d0", "d1"]}, upstream=upstream)
    body = answer.json()
    assert body["object"] == "systemone.scores" and body["family"] == "cross_encoder"
    assert body["data"] == [{"index": 0, "score": 0.2}, {"index": 1, "score": 0.9}]
    assert body["usage"] == _usage(17)
    assert upstream.sent[0].body == {"model": "rr-m", "query": "q", "documents": ["d0", "d1"], "top_n": 0}


def test_usage_is_zero_when_the_worker_gives_none() -> None:
    upstream = FakeUpstream()
    upstream.answer(EMB, _json({"data": [{"index": 0, "embedding": [1.0]}]}))
    assert _post({"model": "emb", "input": "x"}, upstream=upstream).json()["usage"] == _usage(0)


def test_the_decisions_path_is_the_same_api() -> None:
    upstream = FakeUpstream()
    upstream.answer(EMB, _json({"data": [{"index": 0, "embedding": [1.0]}], "usage": _usage(1)}))

    async def both(app: RouterApp) -> list[Answer]:
        return [await request(app, "POST", path, {"model": "emb", "input": "x"}, headers=KEY)
                for path in ("/v1/systemone", "/v1/decisions")]

    one, alias = _serve(upstream, both)
    assert one.status == alias.status == 200 and one.json() == alias.json()


# ---- who may call what ----

def test_a_name_not_published_here_answers_exactly_as_an_unknown_one() -> None:
    config = _config()
    listener = dataclasses.replace(config.listeners[0], systemone=("cls", "emb", "rr", "recipe"))  # not idle
    config = dataclasses.replace(config, listeners=(listener, config.listeners[1]))

    async def both(app: RouterApp) -> list[Answer]:
        return [await request(app, "POST", "/v1/systemone", {"model": name, "input": "x"}, headers=KEY)
                for name in ("idle", "nothing")]

    unpublished, unknown = _serve(FakeUpstream(), both, config)
    assert unpublished.status == unknown.status == 404
    expected = {"error": {"message": "The model `{}` does not exist; available: cls, emb, rr, recipe",
                          "type": "not_found_error", "param": "model", "code": 404}}
    for answer, name in ((unpublished, "idle"), (unknown, "nothing")):
        error = expected["error"]
        assert answer.json() == {"error": {**error, "message": error["message"].format(name)}}


def test_the_api_keys_apply_and_a_listener_without_the_api_has_no_route() -> None:
    async def calls(app: RouterApp) -> list[Answer]:
        body = {"model": "cls", "input": "x"}
        return [await request(app, "POST", "/v1/systemone", body, headers={}),
                await request(app, "POST", "/v1/systemone", body, headers={"authorization": "Bearer nope"}),
                await request(app, "GET", "/v1/systemone/models", headers={}),
                await request(app, "POST", "/v1/systemone", body, port=8081),
                await request(app, "POST", "/v1/decisions", body, port=8081),
                await request(app, "GET", "/v1/systemone/models", port=8081)]

    answers = _serve(FakeUpstream(), calls)
    assert [a.status for a in answers] == [401, 401, 401, 404, 404, 404]
    assert answers[0].json()["error"]["message"].startswith("Missing API key")
    assert answers[1].json()["error"]["message"] == "Incorrect API key provided."


def test_each_route_answers_its_method_only() -> None:
    async def calls(app: RouterApp) -> list[Answer]:
        return [await request(app, "GET", "/v1/systemone", headers=KEY),
                await request(app, "GET", "/v1/decisions", headers=KEY),
                await request(app, "POST", "/v1/systemone/models", {}, headers=KEY)]

    wrong = _serve(FakeUpstream(), calls)
    assert [(a.status, a.headers["allow"]) for a in wrong] == [(405, "POST"), (405, "POST"), (405, "GET, HEAD")]


def test_the_models_list_names_each_published_model_its_family_and_whether_it_routes() -> None:
    answer = _serve(FakeUpstream(), lambda app: request(app, "GET", "/v1/systemone/models", headers=KEY))
    body = answer.json()
    assert body["object"] == "list"
    assert [(m["id"], m["family"], m["routing"], m["object"], m["owned_by"]) for m in body["data"]] == [
        ("cls", "classifier", False, "model", "router"), ("emb", "embedding", False, "model", "router"),
        ("rr", "cross_encoder", False, "model", "router"), ("recipe", "classifier", True, "model", "router"),
        ("idle", "classifier", False, "model", "router")]
    assert all(isinstance(m["created"], int) for m in body["data"])


# ---- body checks ----

BAD: list[tuple[Any, str, str]] = [
    # (body, param, what the message says)
    (b"{not json", "", "not valid JSON"),
    ([1], "", "must be a JSON object"),
    ({"input": "x"}, "model", "model: this field is required"),
    ({"model": 3, "input": "x"}, "model", "model: expected a string, got a number"),
    ({"model": "cls"}, "input", "input: this field is required: a string or a non-empty list of strings"),
    ({"model": "cls", "input": []}, "input", "input: must not be empty"),
    ({"model": "cls", "input": {"a": 1}}, "input",
     "input: expected a string or a non-empty list of strings, got an object"),
    ({"model": "cls", "input": ["x", 2]}, "input[1]", "input[1]: expected a string, got a number"),
    ({"model": "cls", "input": ["x"] * 2049}, "input", "input: 2049 items; at most 2048 per request"),
    ({"model": "cls", "input": "x", "query": "q"}, "query",
     "query: not a field of a classifier model; its fields: model, input, user"),
    ({"model": "emb", "input": "x", "documents": ["d"]}, "documents",
     "documents: not a field of a embedding model; its fields: model, input, user"),
    ({"model": "rr", "input": "x"}, "input", "input: not a field of a cross_encoder model; its fields: model, query, "
                                             "documents, user"),
    ({"model": "cls", "input": "x", "encoding_format": "base64"}, "encoding_format",
     "encoding_format: unknown field; a classifier model's fields: model, input, user"),
    ({"model": "cls", "input": "x", "user": 1}, "user", "user: expected a string, got a number"),
    ({"model": "rr", "documents": ["d"]}, "query", "query: this field is required: a string"),
    ({"model": "rr", "query": ["q"], "documents": ["d"]}, "query", "query: expected a string, got an array"),
    ({"model": "rr", "query": "q", "documents": "d"}, "documents",
     "documents: expected a non-empty list of strings, got a string"),
    ({"model": "rr", "query": "q", "documents": []}, "documents", "documents: must not be empty"),
    ({"model": "rr", "query": "q", "documents": [None]}, "documents[0]", "documents[0]: expected a string, got null"),
]


@pytest.mark.parametrize(("body", "param", "says"), BAD, ids=[b[2][:40] for b in BAD])
def test_a_bad_body_is_a_400_naming_the_field_and_reaches_no_worker(body: Any, param: str, says: str) -> None:
    upstream = FakeUpstream()
    answer = _post(body, upstream=upstream)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert says in error["message"] and error["param"] == (param or None)
    assert not upstream.sent


def test_an_empty_text_is_sent_as_vllms_classify_takes_it() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, _json({"data": [{"index": 0, "probs": [0.5, 0.5]}, {"index": 1, "probs": [0.5, 0.5]}]}))
    assert _post({"model": "cls", "input": ["", "x"]}, upstream=upstream).status == 200
    assert upstream.sent[0].body["input"] == ["", "x"]


# ---- calls that could not be answered ----

def test_the_workers_refusal_of_the_input_is_the_clients_400_with_its_words_and_field() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, _json({"error": {"message": "input[1]: 600 tokens; the context holds 512",
                                          "param": "input[1]", "code": 400}}, status=400))
    answer = _post({"model": "cls", "input": ["x", "y" * 5000]}, upstream=upstream)
    assert answer.status == 400
    assert answer.json()["error"] == {"message": "input[1]: 600 tokens; the context holds 512",
                                      "type": "invalid_request_error", "param": "input[1]", "code": 400}


def test_a_refusal_that_is_not_about_the_input_is_a_502_and_names_no_field_of_ours() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, _json({"error": {"message": "The model `cls-m` does not exist", "param": "model"}}, 404))
    answer = _post({"model": "cls", "input": "x"}, upstream=upstream)
    assert answer.status == 502 and answer.json()["error"]["param"] is None
    assert "refused /classify: HTTP 404" in answer.json()["error"]["message"]


def test_every_worker_full_is_a_429_with_retry_after() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, Reply(hang=True))

    async def body(app: RouterApp) -> Answer:
        first = asyncio.create_task(request(app, "POST", "/v1/systemone", {"model": "cls", "input": "x"}, headers=KEY))
        while not upstream.sent:
            await asyncio.sleep(0)
        answer = await request(app, "POST", "/v1/systemone", {"model": "cls", "input": "y"}, headers=KEY)
        first.cancel()
        return answer

    answer = _serve(upstream, body, _config(max_inflight=1))
    assert answer.status == 429 and answer.headers["retry-after"] == "1"
    assert "every worker full" in answer.json()["error"]["message"]


def test_no_answer_within_the_deployments_timeout_is_a_504() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, Reply(hang=True))
    answer = _serve(upstream, lambda app: request(app, "POST", "/v1/systemone", {"model": "cls", "input": "x"},
                                                  headers=KEY), _config(timeout_s=0.05))
    assert answer.status == 504 and "no answer within 0.05s" in answer.json()["error"]["message"]


def test_a_failed_worker_and_an_answer_of_another_shape_are_502s() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, Reply(refuse="HTTP 500: boom", retryable=False))
    upstream.answer(EMB, _json({"data": []}))
    failed = _post({"model": "cls", "input": "x"}, upstream=upstream)
    assert failed.status == 502 and "HTTP 500: boom" in failed.json()["error"]["message"]
    wrong = _post({"model": "emb", "input": "x"}, upstream=upstream)
    assert wrong.status == 502 and "not the pooling API's" in wrong.json()["error"]["message"]


def test_a_worker_not_ready_is_a_503() -> None:
    class Down(FakeUpstream):
        async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
            return False, "HTTP 503"

    config = _config()
    pools = build_pools(config)

    async def go() -> Answer:
        upstream = Down()
        runtime = Deployments(config, upstream)
        app = RouterApp(config, Router(dataclasses.replace(config, entries={"e": EntryConfig("e", ("p",))})), pools,
                        upstream, RouterMetrics(pools), runtime=runtime)
        await runtime.start()
        try:
            return await request(app, "POST", "/v1/systemone", {"model": "cls", "input": "x"}, headers=KEY)
        finally:
            await runtime.stop()
            app.close()

    answer = asyncio.run(go())
    assert answer.status == 503 and "no ready replica" in answer.json()["error"]["message"]


# ---- native recipes ----

def _label(top: str, probs: dict[str, float]) -> Label:
    return Label(top, probs[top], probs)


def _result(items: tuple[ItemResult, ...], **extra: Any) -> RecipeResult:
    return RecipeResult(items=items, stages_called=("fast", "slow"), calls=3, judge_calls=1, prompt_tokens=9,
                        deadline_s=2.0, max_calls=3, **extra)


def test_a_classifier_recipes_rows_are_each_stages_own_output_and_say_whether_the_judge_chose_it() -> None:
    fast = StageOutput("fast", _label("a", {"a": 0.95, "b": 0.05}), True, None)
    unsure = StageOutput("fast", _label("a", {"a": 0.55, "b": 0.45}), False, "top probability 0.55 < 0.9")
    slow = StageOutput("slow", _label("b", {"a": 0.4, "b": 0.6}), False, "top probability 0.6 < 0.9")
    result = _result((ItemResult(fast, (fast,), None), ItemResult(slow, (unsure, slow), "chose"),
                      ItemResult(slow, (unsure, slow), "abstained")))
    body = json.loads(_encode(recipe_answer("triage", "classifier", result)))
    assert body["object"] == "systemone.classification" and body["model"] == "triage"
    assert body["data"] == [
        {"index": 0, "label": "a", "probability": 0.95, "probs": {"a": 0.95, "b": 0.05}, "stage": "fast",
         "judged": False},
        {"index": 1, "label": "b", "probability": 0.6, "probs": {"a": 0.4, "b": 0.6}, "stage": "slow", "judged": True},
        {"index": 2, "label": "b", "probability": 0.6, "probs": {"a": 0.4, "b": 0.6}, "stage": "slow",
         "judged": False}]
    assert body["deployment"] == "fast" and body["usage"] == _usage(9)
    assert body["routing"] == {"recipe": "triage", "decision": body["routing"]["decision"],
                               "stages_called": ["fast", "slow"], "calls": 3, "judge_calls": 1, "deadline_s": 2.0,
                               "max_calls": 3}


def test_a_cross_encoder_recipe_answers_one_stages_scores_in_document_order() -> None:
    slow = StageOutput("slow", (0.1, 0.8, 0.3), True, None)
    result = _result((ItemResult(slow, (StageOutput("fast", (0.5, 0.5, 0.5), False, "margin 0 < 0.1"), slow), None),))
    body = json.loads(_encode(recipe_answer("rank", "cross_encoder", result)))
    assert body["object"] == "systemone.scores" and body["deployment"] == "slow"
    assert body["data"] == [{"index": i, "score": s, "stage": "slow", "judged": False}
                            for i, s in enumerate((0.1, 0.8, 0.3))]


def test_a_recipe_request_runs_the_recipe_with_the_runtime_and_answers_its_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, NativeInput]] = []

    async def run(entry: EntryConfig, inp: NativeInput, **ports: Any) -> RecipeResult:
        assert isinstance(ports["models"], Deployments) and isinstance(ports["router"], Router)
        seen.append((entry.name, inp))
        out = StageOutput("cls", _label("a", {"a": 1.0, "b": 0.0}), True, None)
        return _result((ItemResult(out, (out,), None),))

    monkeypatch.setattr(native, "run", run)
    answer = _post({"model": "recipe", "input": "x"})
    assert answer.status == 200 and answer.json()["routing"]["recipe"] == "recipe"
    assert seen == [("recipe", NativeInput("classifier", texts=("x",)))]


def test_a_recipe_that_no_stage_answered_answers_with_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.router.runtime.models import ModelUnavailable

    async def run(entry: EntryConfig, inp: NativeInput, **ports: Any) -> RecipeResult:
        raise ModelUnavailable("recipe 'recipe': no stage answered within 2s", 504)

    monkeypatch.setattr(native, "run", run)
    answer = _post({"model": "recipe", "input": "x"})
    assert answer.status == 504 and answer.json()["error"]["message"] == "recipe 'recipe': no stage answered within 2s"


def _encode(value: Any) -> bytes:
    return msgspec.json.encode(value)



def test_a_client_that_leaves_ends_its_call_at_once_not_at_the_deadline() -> None:
    upstream = FakeUpstream()
    upstream.answer(CLS, Reply(hang=True))
    messages = [{"type": "http.request", "body": json.dumps({"model": "cls", "input": "x"}).encode(),
                 "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}  # gone right after its body

    async def leave(app: RouterApp) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/systemone", "query_string": b"",
                 "server": ("127.0.0.1", 8080), "headers": [(b"authorization", b"Bearer k")]}
        # The deployment would wait 60 s for the hung worker: the bound fails the test if the call is not ended.
        await asyncio.wait_for(app(scope, receive, send), 5)
        assert app.metrics.requests.labels("listener-0", "systemone", "499")._value.get() == 1
        return sent

    assert _serve(upstream, leave, _config(timeout_s=60)) == []  # nobody to answer
