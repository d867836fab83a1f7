"""Pooling through the fleet: a frontend process over two headless sim engine ranks with --runner pooling
(the sim's deterministic vectors, services/engine/backends/sim/pooler.py) on tcp loopback, driven by the
official openai SDK and raw HTTP. The values a client gets are the engine's, in input order, over two
ranks; bad input is a 400 naming the field while other calls complete; the wrong task is a 400 naming it."""
from __future__ import annotations

import concurrent.futures
from array import array
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from prompting.model_files import model_config
from protocol import PoolingParams
from protocol.grpc import pb2, pb2_grpc
from services.engine.backends.sim.pooler import SimPooler
from services.frontend.model import Model
from services.frontend.requests.pooling_inputs import MAX_INPUTS
from services.frontend.requests.pooling_model import PoolingModel
from services.frontend.requests.prompt_encoding import encode_pairs
from tests.support.procs import EngineProc, FrontendProc, free_port_block, start_engine, start_frontend

MODEL = "minilm"
GRPC_PORT: dict[str, int] = {}  # the fleet's --grpc-port, chosen when it starts
TEXTS = ["The cat sat on the mat.", "Routing with decision models", "一个中文句子", "x"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProc, FrontendProc]]:
    tmp = tmp_path_factory.mktemp("pooling-fleet")
    engine = start_engine(tmp, "--model", MODEL, "--backend", "sim", "--runner", "pooling", "--sim-decode-ms", "1",
                          ranks=2)
    try:
        addresses = ",".join(engine.endpoint(i) for i in range(2))
        fe = start_frontend(tmp, "--model", MODEL, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                            "--engine-addresses", addresses, "--engine-timeout", "1.0",
                            "--grpc-port", str(GRPC_PORT.setdefault("port", free_port_block(1, spread=0))))
        yield engine, fe
        assert fe.stop() == 0, fe.log()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def client(fleet: tuple[EngineProc, FrontendProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[1].url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def inference(fleet: tuple[EngineProc, FrontendProc]) -> Iterator[pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{GRPC_PORT['port']}") as channel:
        yield pb2_grpc.InferenceStub(channel)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(MODEL, MODEL)


def expected(model: Model, text: str, task: str = "embed") -> list[float]:
    """What the sim engine pools for this text (its vectors depend on the token ids alone)."""
    pooler = SimPooler(model=MODEL, hidden_size=384, num_labels=2)
    values, _ = pooler.pool(PoolingParams(task), model.encode(text, add_special_tokens=True))
    return values


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-6 for x, y in zip(a, b, strict=True))  # float32 of the same


def test_sdk_embeddings_base64_and_float_are_the_engines_vectors_in_order(client: openai.OpenAI,
                                                                          model: Model) -> None:
    # The SDK asks for base64 by default (and decodes it as little-endian float32); then floats.
    for fmt in (openai.NOT_GIVEN, "float"):
        result = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format=fmt)  # type: ignore[arg-type]
        assert [d.index for d in result.data] == list(range(len(TEXTS)))
        for text, item in zip(TEXTS, result.data, strict=True):
            assert close(item.embedding, expected(model, text)), text
        tokens = sum(len(model.encode(t, add_special_tokens=True)) for t in TEXTS)
        assert result.usage.prompt_tokens == result.usage.total_tokens == tokens
        assert result.model == MODEL


def test_models_list_the_tasks_and_chat_is_a_400_naming_the_task(client: openai.OpenAI) -> None:
    listed = client.models.list().data[0]
    assert listed.id == MODEL and listed.model_extra["tasks"] == ["embed", "token_embed"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    message = refused.value.body["message"]  # type: ignore[index]
    assert message.startswith("The model does not support Chat Completions API") and "'generate'" in message


def test_pooling_route_runs_the_models_own_task_only(fleet: tuple[EngineProc, FrontendProc], model: Model) -> None:
    """As vLLM: /pooling pools with the model's own task (embed for MiniLM); the engines' other task,
    token_embed, is refused, and so is /classify."""
    answer = httpx.post(fleet[1].url + "/pooling", json={"input": "two words"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert close(answer.json()["data"][0]["data"], expected(model, "two words"))
    refused = httpx.post(fleet[1].url + "/pooling", json={"input": "two words", "task": "token_embed"}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "task", refused.text
    refused = httpx.post(fleet[1].url + "/classify", json={"input": "two words"}, timeout=60)
    assert refused.status_code == 400 and "Classification API" in refused.json()["error"]["message"], refused.text


def test_bad_input_is_a_400_while_other_calls_complete(fleet: tuple[EngineProc, FrontendProc],
                                                      client: openai.OpenAI, model: Model) -> None:
    url = fleet[1].url + "/v1/embeddings"
    bad = [{"input": ["x"] * 10_000}, {"input": []}, {"input": [[1, 2], "a"]}, {"input": "a", "dimensions": 8},
           {"input": ["word " * 600]}]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        good = [pool.submit(client.embeddings.create, model=MODEL, input=TEXTS, encoding_format="float")
                for _ in range(4)]
        refused = [pool.submit(httpx.post, url, json=body, timeout=60) for body in bad]
        answers = [f.result() for f in refused]
        results = [f.result() for f in good]
    assert [a.status_code for a in answers] == [400] * len(bad), [a.text[:300] for a in answers]
    params = [a.json()["error"]["param"] for a in answers]
    assert [a.status_code for a in answers] == [400] * len(bad), [a.text for a in answers]
    assert params == ["input", "input", "input[1]", "dimensions", "input"]
    assert f"at most {MAX_INPUTS}" in answers[0].json()["error"]["message"]
    assert "maximum context length" in answers[4].json()["error"]["message"]
    for result in results:
        assert close(result.data[0].embedding, expected(model, TEXTS[0]))
    # Truncation is honoured rather than refused when asked for.
    long = httpx.post(url, json={"input": ["word " * 600], "truncate_prompt_tokens": 16}, timeout=60)
    assert long.status_code == 200 and long.json()["usage"]["prompt_tokens"] == 16


def test_grpc_embed_gives_the_engines_values_as_float32_bytes(inference: pb2_grpc.InferenceStub,
                                                             model: Model) -> None:
    ids = [model.encode(t, add_special_tokens=True) for t in TEXTS]
    inputs = [pb2.PoolInput(token_ids=row) for row in ids]
    embedded = inference.Embed(pb2.PoolRequest(request_id="e1", inputs=inputs), timeout=60)
    assert embedded.request_id == "e1" and embedded.usage.prompt_tokens == sum(map(len, ids))
    for text, out in zip(TEXTS, embedded.outputs, strict=True):
        assert list(out.shape) == [384] and close(list(array("f", out.values)), expected(model, text)), text
    with pytest.raises(grpc.RpcError) as refused:  # an embedding model does not classify
        inference.Classify(pb2.PoolRequest(inputs=inputs[:2]), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not support Classify API: its pooling task is 'embed'" in refused.value.details()


def test_grpc_refusals_name_the_field_and_generate_names_the_task(inference: pb2_grpc.InferenceStub) -> None:
    for request, words in [(pb2.PoolRequest(), "inputs: must not be empty"),
                           (pb2.PoolRequest(inputs=[pb2.PoolInput(token_ids=[101, 102])], dimensions=8),
                            "does not support Matryoshka"),
                           (pb2.PoolRequest(inputs=[pb2.PoolInput(token_ids=[101, 10**8])]), "out of range")]:
        with pytest.raises(grpc.RpcError) as refused:
            inference.Embed(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in refused.value.details()
    with pytest.raises(grpc.RpcError) as refused:
        inference.Generate(pb2.GenerateRequest(token_ids=[101, 102], sampling_params=pb2.SamplingParams(max_tokens=2)),
                           timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "The model does not support Generate API" in refused.value.details()


def _one_rank(tmp: Path, model: str, *frontend_args: str) -> Iterator[FrontendProc]:
    """A frontend on one sim rank of `model`, the engine's flags the defaults (its runner and head come
    from the checkpoint's architecture, as in vLLM)."""
    engine = start_engine(tmp, "--model", model, "--backend", "sim", "--sim-instant")
    try:
        fe = start_frontend(tmp, "--model", model, "--data-parallel-size-local", "0",
                            "--engine-addresses", engine.endpoint(), *frontend_args)
        yield fe
        assert fe.stop() == 0, fe.log()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    """The tiny classifier (labels chat, code, math), with gRPC: it classifies because its architecture
    is a classifier's."""
    yield from _one_rank(tmp_path_factory.mktemp("classifier-fleet"), "tiny-classifier",
                         "--grpc-port", str(GRPC_PORT.setdefault("classifier", free_port_block(1, spread=0))))


def test_classify_and_rerank_through_the_fleet(classifier: FrontendProc) -> None:
    tiny = Model.load("tiny-classifier", "tiny-classifier")
    texts = ["write a sort in rust", "what is 2 + 2"]
    answer = httpx.post(classifier.url + "/classify", json={"input": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    pooler = SimPooler(model="tiny-classifier", hidden_size=64, num_labels=3)
    for text, item in zip(texts, answer.json()["data"], strict=True):
        want, _ = pooler.pool(PoolingParams("classify"), tiny.encode(text, add_special_tokens=True))
        assert close(item["probs"], want) and item["label"] in ("chat", "code", "math")
    refused = httpx.post(classifier.url + "/v1/embeddings", json={"input": "x"}, timeout=60)
    assert refused.status_code == 400 and "Embeddings API" in refused.json()["error"]["message"]
    with grpc.insecure_channel(f"127.0.0.1:{GRPC_PORT['classifier']}") as channel:
        inputs = [pb2.PoolInput(token_ids=tiny.encode(text, add_special_tokens=True)) for text in texts]
        classified = pb2_grpc.InferenceStub(channel).Classify(pb2.PoolRequest(inputs=inputs), timeout=60)
    for item, out in zip(answer.json()["data"], classified.outputs, strict=True):
        assert list(out.shape) == [3] and close(list(array("f", out.values)), item["probs"])


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    """The tiny cross-encoder (one label): a classifier by its architecture, so /score takes the
    cross-encoder's path, as in vLLM."""
    yield from _one_rank(tmp_path_factory.mktemp("cross-encoder-fleet"), "tiny-cross-encoder")


def test_score_and_rerank_through_the_fleet_are_the_cross_encoders_pair_scores(cross_encoder: FrontendProc) -> None:
    tiny = Model.load("tiny-cross-encoder", "tiny-cross-encoder")
    facts = PoolingModel.of("ce", tiny.tokenizer, model_config(tiny.path))
    query, docs = "what is a cat", ["a cat is an animal", "rust is a language", "cats purr"]
    pooler = SimPooler(model="tiny-cross-encoder", hidden_size=64, num_labels=1)
    want = []
    for enc in encode_pairs(tiny.tokenizer, [query], docs, keep=None, side=None,
                            token_types=facts.token_types, use_sep_token=facts.use_sep_token):
        assert enc.token_type_split is not None  # BERT reads token types: the engine is told where doc starts
        value, _ = pooler.pool(PoolingParams("classify", token_type_split=enc.token_type_split), enc.ids)
        want.append(value[0])
    answer = httpx.post(cross_encoder.url + "/score", json={"queries": query, "documents": docs}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert close([d["score"] for d in answer.json()["data"]], want)
    answer = httpx.post(cross_encoder.url + "/rerank", json={"query": query, "documents": docs}, timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -want[i])
    assert close([r["relevance_score"] for r in results], sorted(want, reverse=True))
