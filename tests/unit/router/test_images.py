"""The Images API and direct calls to published pools, in process through the router's ASGI app (the
replicas a fake of the Upstream port): every images body check is a 400 naming its field in OpenAI's
shape; images route only among decisions whose pools all declare image output, chat only among text
ones; a published pool is called straight, with no signals and no decisions."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import (
    ClassifierSignal,
    DecisionRule,
    EntryConfig,
    RouterConfig,
    SignalRef,
    parse_config,
)
from services.router.decision.decisions import NoEligibleDecision, models_needed
from services.router.decision.engine import Router
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.images import images_request
from services.router.listeners.direct import DirectPools
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply, completion

IMAGES = "/v1/images/generations"
CHAT = "/v1/chat/completions"
RAW: dict[str, Any] = {
    "listeners": [{"port": 8080}, {"port": 8081, "name": "other"}],
    "pools": {"text": {"model": "text-m", "replicas": [{"url": "http://text:8000"}]},
              "paint": {"model": "paint-m", "replicas": [{"url": "http://paint:8000"}]},
              "both": {"model": "both-m", "replicas": [{"url": "http://both:8000"}]}},
    "entries": {
        # Decisions mixing text and image pools: the keyword `draw` matches in both APIs' texts.
        "mixed": {"signals": [{"name": "draw", "type": "keyword", "keywords": ["draw"]},
                              {"name": "any", "type": "regex", "pattern": "."}],
                  "decisions": [{"name": "drawing-text", "when": "draw", "pools": ["text"]},
                                {"name": "drawing", "when": "draw", "pools": ["paint"]},
                                {"name": "partly", "when": "any", "pools": ["paint", "text"]}],
                  "default": ["text"]},
        "painter": {"default": ["paint"]},
        "chatty": {"default": ["text"]},
        "flexible": {"default": ["both"]},
        "escalating": {"default": ["text"], "algorithm": {"type": "escalate", "stages": ["text", "paint"]}},
    },
}
OUTPUTS = {"text": ("text",), "paint": ("image",), "both": ("text", "image")}
PNG = {"created": 1, "data": [{"b64_json": "iVBORw0KGgo="}]}


def config(published: tuple[str, ...] = ("paint", "text")) -> RouterConfig:
    """RAW with the pools' outputs and the first listener's published pools (their config reader is
    another part's: set here on the parsed config)."""
    parsed = parse_config(RAW)
    pools = {name: replace(pool, outputs=OUTPUTS[name]) for name, pool in parsed.pools.items()}
    first, *rest = parsed.listeners
    return replace(parsed, pools=pools, listeners=(replace(first, pools=published), *rest))


def app(upstream: FakeUpstream | None = None, published: tuple[str, ...] = ("paint", "text")) -> RouterApp:
    router = Router(config(published))
    pools = build_pools(router.config)
    return RouterApp(router.config, router, pools, upstream or FakeUpstream(), RouterMetrics(pools))


def post(path: str, body: Any, upstream: FakeUpstream | None = None, *, port: int = 8080) -> Answer:
    return asyncio.run(request(app(upstream), "POST", path, body, port=port))


def painted(upstream: FakeUpstream) -> None:
    """The image pools answer an image; the text pool a completion."""
    for url in ("http://paint:8000", "http://both:8000"):
        upstream.answer(url, Reply(chunks=(json.dumps(PNG).encode(),)))
    upstream.answer("http://text:8000", Reply(chunks=(completion("words"),)))


def refusal(answer: Answer) -> tuple[str, str]:
    """(param, message) of a 400 in OpenAI's shape."""
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    return error["param"], error["message"]


# ---- the body checks ----

GOOD = {"model": "painter", "prompt": "a red square"}
BAD: list[tuple[dict[str, Any], str, str]] = [
    # (fields over GOOD, the param named, a piece of the message)
    ({"model": None}, "model", "required"),
    ({"model": ""}, "model", "required"),
    ({"model": 3}, "model", "required"),
    ({"prompt": None}, "prompt", "required"),
    ({"prompt": ""}, "prompt", "non-empty"),
    ({"prompt": ["a"]}, "prompt", "string"),
    ({"n": 0}, "n", "from 1 to 10"),
    ({"n": 11}, "n", "from 1 to 10"),
    ({"n": 1.5}, "n", "integer"),
    ({"n": "2"}, "n", "integer"),
    ({"n": True}, "n", "integer"),
    ({"size": "100x100"}, "size", "1024x1024"),
    ({"size": 1024}, "size", "auto"),
    ({"response_format": "png"}, "response_format", "url, b64_json"),
    ({"output_format": "gif"}, "output_format", "png, jpeg, webp"),
    ({"quality": "ultra"}, "quality", "auto, standard, hd, low, medium, high"),
    ({"style": "noir"}, "style", "vivid, natural"),
    ({"background": "clear"}, "background", "transparent, opaque, auto"),
    ({"moderation": "none"}, "moderation", "low, auto"),
    ({"output_compression": -1}, "output_compression", "from 0 to 100"),
    ({"output_compression": 101}, "output_compression", "from 0 to 100"),
    ({"output_compression": "high"}, "output_compression", "integer"),
    ({"user": 7}, "user", "string"),
    ({"stream": True}, "stream", "not supported"),
    ({"stream": "yes"}, "stream", "boolean"),
    ({"partial_images": 2}, "partial_images", "not support"),
    ({"partial_images": 0}, "partial_images", "not support"),
    ({"quantity": 2}, "quantity", "the Images API takes: model, prompt, n, size"),
]


@pytest.mark.parametrize(("fields", "param", "says"), BAD, ids=[f"{p}={f[p]!r}" for f, p, _ in BAD])
def test_each_bad_field_is_a_400_naming_it_and_what_it_allows(fields: dict[str, Any], param: str, says: str) -> None:
    upstream = FakeUpstream()
    named, message = refusal(post(IMAGES, {**GOOD, **fields}, upstream))
    assert named == param and says in message, message
    assert upstream.sent == []  # refused before any pool saw it


def test_a_body_that_is_no_object_is_a_400() -> None:
    assert post(IMAGES, [GOOD]).status == 400
    with pytest.raises(CodecError) as info:
        images_request("a red square")
    assert info.value.param == ""


def test_every_documented_value_passes_and_nulls_count_as_absent() -> None:
    body = {**GOOD, "n": 10.0, "size": "1792x1024", "response_format": "b64_json", "output_format": "webp",
            "quality": "hd", "style": "natural", "background": "transparent", "moderation": "low",
            "output_compression": 0, "user": "u1", "stream": False, "partial_images": None}
    assert images_request(dict(body))["n"] == 10  # a whole-number float is its integer, as vLLM takes it
    assert images_request({**GOOD, "size": None, "style": None, "n": None}) == {**GOOD, "size": None,
                                                                                "style": None, "n": None}


# ---- routing by output ----

def test_images_go_to_an_image_pool_with_its_model_and_the_answer_comes_back_as_is() -> None:
    upstream = FakeUpstream()
    painted(upstream)
    answer = post(IMAGES, {**GOOD, "n": 2, "size": "256x256"}, upstream)
    assert answer.status == 200 and answer.json() == PNG
    assert (answer.headers["x-router-entry"], answer.headers["x-router-decision"],
            answer.headers["x-router-pool"]) == ("painter", "default", "paint")
    [sent] = upstream.sent
    assert (sent.url, sent.path) == ("http://paint:8000", IMAGES)
    assert sent.body == {"model": "paint-m", "prompt": "a red square", "n": 2, "size": "256x256"}


def test_a_backend_refusal_is_relayed_with_its_status_and_body() -> None:
    upstream = FakeUpstream()
    refused = {"error": {"message": "content policy", "type": "invalid_request_error", "param": "prompt",
                         "code": "content_policy_violation"}}
    upstream.answer("http://paint:8000", Reply(status=400, chunks=(json.dumps(refused).encode(),)))
    answer = post(IMAGES, GOOD, upstream)
    assert answer.status == 400 and answer.json() == refused
    assert answer.headers["x-router-pool"] == "paint"


def test_images_skip_decisions_whose_pools_are_not_all_image_pools() -> None:
    upstream = FakeUpstream()
    painted(upstream)
    # `draw` holds for drawing-text (a text pool) and drawing: images take drawing, chat drawing-text.
    drawn = post(IMAGES, {"model": "mixed", "prompt": "draw a cat"}, upstream)
    assert drawn.status == 200 and drawn.headers["x-router-decision"] == "drawing"
    chat = post(CHAT, {"model": "mixed", "messages": [{"role": "user", "content": "draw a cat"}]}, upstream)
    assert chat.status == 200 and chat.headers["x-router-decision"] == "drawing-text"
    assert [(s.url, s.path) for s in upstream.sent] == [("http://paint:8000", IMAGES), ("http://text:8000", CHAT)]
    # Without `draw`, the only decision that holds mixes pools (skipped by both) and the default is
    # text: images have nowhere to go.
    param, message = refusal(post(IMAGES, {"model": "mixed", "prompt": "a cat"}, upstream))
    assert param == "model" and "routes to no image-output pool" in message
    chat = post(CHAT, {"model": "mixed", "messages": [{"role": "user", "content": "a cat"}]}, upstream)
    assert chat.headers["x-router-decision"] == "default"


def test_chat_never_goes_to_an_image_only_pool() -> None:
    for path, body in ((CHAT, {"model": "painter", "messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"model": "painter", "prompt": "hi"}),
                       ("/v1/responses", {"model": "painter", "input": "hi"})):
        param, message = refusal(post(path, body))
        assert param == "model" and "routes to no text-output pool" in message, path
    messages = post("/v1/messages", {"model": "painter", "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "hi"}]})
    assert messages.status == 400 and "routes to no text-output pool" in messages.json()["error"]["message"]


def test_a_pool_with_both_outputs_serves_both_and_escalate_needs_every_stage() -> None:
    upstream = FakeUpstream()
    painted(upstream)
    assert post(IMAGES, {"model": "flexible", "prompt": "x"}, upstream).status == 200
    assert post(CHAT, {"model": "flexible", "messages": [{"role": "user", "content": "x"}]}, upstream).status == 200
    # An escalate entry calls its stages whatever the decision: one image-only stage rules chat out.
    param, _ = refusal(post(CHAT, {"model": "escalating", "messages": [{"role": "user", "content": "x"}]}))
    assert param == "model"


def test_router_choose_filters_by_output() -> None:
    router = Router(config())
    image = asyncio.run(router.choose({"model": "mixed", "prompt": "draw"}, outputs="image"))
    assert (image.decision.name, image.plan) == ("drawing", ("paint",))
    text = asyncio.run(router.choose({"model": "mixed", "prompt": "draw"}))  # text is the default
    assert (text.decision.name, text.plan) == ("drawing-text", ("text",))
    with pytest.raises(NoEligibleDecision):
        asyncio.run(router.choose({"model": "chatty", "prompt": "x"}, outputs="image"))


def test_a_decision_passed_over_for_its_output_calls_no_model_signal() -> None:
    entry = EntryConfig("e", ("text",), signals=(ClassifierSignal("kind", "intent", ("code",)),),
                        decisions=(DecisionRule("coding", SignalRef("kind"), ("paint",)),))
    assert models_needed(entry, {}) == (["kind"], None)
    assert models_needed(entry, {}, eligible=lambda pools: "paint" not in pools) == ([], None)


# ---- direct calls to published pools ----

def test_a_chat_call_naming_a_published_pool_goes_straight_to_it() -> None:
    upstream = FakeUpstream()
    painted(upstream)
    # `mixed` would route `draw` elsewhere; naming the pool skips signals and decisions.
    answer = post(CHAT, {"model": "text", "messages": [{"role": "user", "content": "draw"}]}, upstream)
    assert answer.status == 200
    assert (answer.headers["x-router-entry"], answer.headers["x-router-decision"],
            answer.headers["x-router-pool"]) == ("text", "direct", "text")
    assert upstream.sent[0].body["model"] == "text-m"


def test_an_images_call_naming_a_published_image_pool_goes_straight_and_a_text_pool_is_refused() -> None:
    upstream = FakeUpstream()
    painted(upstream)
    answer = post(IMAGES, {"model": "paint", "prompt": "x"}, upstream)
    assert answer.status == 200 and answer.headers["x-router-decision"] == "direct"
    param, message = refusal(post(IMAGES, {"model": "text", "prompt": "x"}, upstream))
    assert param == "model" and "the pool's `outputs` lack 'image'" in message
    param, message = refusal(post(CHAT, {"model": "paint", "messages": [{"role": "user", "content": "x"}]}))
    assert param == "model" and "text-output" in message


def test_an_unpublished_pool_is_the_same_404_as_an_unknown_model() -> None:
    unpublished = post(CHAT, {"model": "both", "messages": [{"role": "user", "content": "x"}]})
    unknown = post(CHAT, {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert unpublished.status == unknown.status == 404
    assert unpublished.json()["error"]["param"] == unknown.json()["error"]["param"] == "model"
    assert unpublished.json()["error"]["message"].replace("both", "nope") == unknown.json()["error"]["message"]
    # Published on the first listener only.
    assert post(CHAT, {"model": "text", "messages": [{"role": "user", "content": "x"}]}, port=8081).status == 404


def test_models_lists_the_published_pools_after_the_entries() -> None:
    listed = asyncio.run(request(app(), "GET", "/v1/models")).json()
    assert [m["id"] for m in listed["data"]] == ["mixed", "painter", "chatty", "flexible", "escalating",
                                                 "paint", "text"]
    other = asyncio.run(request(app(), "GET", "/v1/models", port=8081)).json()
    assert "text" not in [m["id"] for m in other["data"]]


def test_explain_shows_a_direct_call() -> None:
    out = post("/v1/router/explain", {"model": "text", "messages": [{"role": "user", "content": "draw"}]}).json()
    assert (out["entry"], out["decision"], out["plan"], out["signals"], out["pool"]) == (
        "text", "direct", ["text"], {}, "text")


def test_an_entry_of_the_same_name_comes_before_a_published_pool() -> None:
    published = config()
    entries = {**published.entries, "text": replace(published.entries["flexible"], name="text")}
    router = Router(replace(published, entries=entries))
    pools = build_pools(router.config)
    upstream = FakeUpstream()
    routed = asyncio.run(request(RouterApp(router.config, router, pools, upstream, RouterMetrics(pools)), "POST",
                                 CHAT, {"model": "text", "messages": [{"role": "user", "content": "x"}]}))
    assert (routed.headers["x-router-decision"], routed.headers["x-router-pool"]) == ("default", "both")
    assert DirectPools(published).choose(published.listeners[0], 3, "x") is None
