"""Pooling through the fleet (a vllm-backend engine with --runner pooling behind a frontend) against
vLLM's own offline LLM.embed / classify / score on the same checkpoints and inputs, and MiniLM's
embeddings against the sentence-transformers reference computed with transformers. Requests and
responses are in vLLM's served shapes (POST /v1/embeddings, /classify, /score, /rerank)."""
from __future__ import annotations

import base64
import math
from typing import Any

import httpx
import numpy as np
import pytest

import checkpoints
from tests.support.procs import EngineProc, FrontendProc

# vllm's import trips torch's `reduce_op` FutureWarning (see test_tiny_model.py).
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# The engines and offline LLMs (minilm_engine, minilm_llm, ...) are tests/vllm/conftest.py's, one of each
# per checkpoint for all of tests/vllm. MiniLM's sentence-transformers max_seq_length (and the engines' max_model_len).
MINILM_MAX_SEQ_LEN = 256
# The fleet runs the same vLLM kernels on the same checkpoint as the offline LLM: equal up to float
# rounding of a different batch (measured: 0 for MiniLM, 1.2e-7 for the classifier, single vs batched).
TIGHT = 1e-5
# sentence-transformers runs MiniLM in float32; vLLM on CPU picks float16 for it.
REFERENCE_COSINE = 1e-3

TEXTS = [
    "A man is eating food.",
    "Write a Python function that sorts a list of tuples by their second element.",
    "What is the integral of x squared from 0 to 3?",
    "你好，世界！今天天气很好。",
    "The quick brown fox jumps over the lazy dog. " * 12,  # ~120 tokens
    "ok",
]
QUERY = "How do I sort a list in Python?"
DOCUMENTS = [
    "Use sorted(xs) or xs.sort(); both take a key function.",
    "The Amazon is the largest rainforest on Earth.",
    "Python lists have a sort method that sorts in place.",
    "Bake the bread at 220 degrees for thirty minutes.",
    "In Rust, call v.sort() on a mutable Vec.",
]


def _fleet(shared: Any, engine: EngineProc, name: str) -> FrontendProc:
    """A frontend on the shared pooling engine for `name` (tests/vllm/conftest.py), shared by command line."""
    return shared.frontend("--model", name, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                           "--engine-addresses", engine.endpoint(0))


@pytest.fixture(scope="module")
def minilm_fleet(shared: Any, minilm_engine: EngineProc) -> FrontendProc:
    return _fleet(shared, minilm_engine, "minilm")


@pytest.fixture(scope="module")
def classifier_fleet(shared: Any, classifier_engine: EngineProc) -> FrontendProc:
    return _fleet(shared, classifier_engine, "tiny-classifier")


@pytest.fixture(scope="module")
def cross_encoder_fleet(shared: Any, cross_encoder_engine: EngineProc) -> FrontendProc:
    return _fleet(shared, cross_encoder_engine, "tiny-cross-encoder")


def _post(fleet: FrontendProc, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(fleet.url + path, json=body, timeout=120)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def _close(got: list[float], want: list[float], tol: float = TIGHT) -> None:
    assert len(got) == len(want)
    diff = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64))))
    assert diff <= tol, (diff, got[:4], want[:4])


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    return 1.0 - float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _sentence_transformers_reference(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 as sentence-transformers runs it (modules.json: Transformer, then 1_Pooling with
    pooling_mode_mean_tokens, then Normalize; max_seq_length 256), in float32 with transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = str(checkpoints.resolve("minilm"))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=MINILM_MAX_SEQ_LEN, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(tokens.dtype)
    mean = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def test_offline_vllm_serves_each_checkpoint_with_its_task(
        minilm_llm: Any, classifier_llm: Any, cross_encoder_llm: Any) -> None:
    assert "embed" in minilm_llm.supported_tasks
    assert "classify" in classifier_llm.supported_tasks and "classify" in cross_encoder_llm.supported_tasks
    (embedded,) = minilm_llm.embed(["hello"], use_tqdm=False)
    assert len(embedded.outputs.embedding) == 384
    (classified,) = classifier_llm.classify(["hello"], use_tqdm=False)
    assert len(classified.outputs.probs) == 3 and math.isclose(sum(classified.outputs.probs), 1, abs_tol=1e-5)
    scored = cross_encoder_llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    assert len({round(s.outputs.score, 4) for s in scored}) == len(DOCUMENTS)  # a ranking, not a tie


def test_offline_vllm_matches_the_sentence_transformers_reference(minilm_llm: Any) -> None:
    """The reference itself is right: vLLM's MiniLM agrees with it, and texts are far apart, so the
    fleet's check below against the same reference can fail."""
    reference = _sentence_transformers_reference(TEXTS)
    offline = [np.asarray(o.outputs.embedding) for o in minilm_llm.embed(TEXTS, use_tqdm=False)]
    for want, got in zip(reference, offline, strict=True):
        assert _cosine_distance(got, want) < REFERENCE_COSINE
    assert min(_cosine_distance(reference[i], reference[j])
               for i in range(len(TEXTS)) for j in range(i)) > 100 * REFERENCE_COSINE


def test_fleet_embeddings_match_the_sentence_transformers_reference(minilm_fleet: FrontendProc) -> None:
    body = _post(minilm_fleet, "/v1/embeddings", {"model": "minilm", "input": TEXTS})
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    reference = _sentence_transformers_reference(TEXTS)
    for item, want in zip(body["data"], reference, strict=True):
        assert item["object"] == "embedding"
        got = np.asarray(item["embedding"])
        assert got.shape == (384,) and math.isclose(float(np.linalg.norm(got)), 1.0, abs_tol=1e-3)
        assert _cosine_distance(got, want) < REFERENCE_COSINE


def test_fleet_embeddings_equal_vllm_offline(minilm_fleet: FrontendProc, minilm_llm: Any) -> None:
    offline = minilm_llm.embed(TEXTS, use_tqdm=False)
    body = _post(minilm_fleet, "/v1/embeddings", {"model": "minilm", "input": TEXTS, "encoding_format": "float"})
    for item, want in zip(body["data"], offline, strict=True):
        _close(item["embedding"], want.outputs.embedding)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in offline)
    assert body["usage"]["prompt_tokens"] == prompt_tokens == body["usage"]["total_tokens"]
    # The same inputs as token ids, one at a time, and as base64 (little-endian float32, OpenAI's).
    single = _post(minilm_fleet, "/v1/embeddings", {"model": "minilm", "input": TEXTS[1]})
    _close(single["data"][0]["embedding"], offline[1].outputs.embedding)
    ids = [list(o.prompt_token_ids) for o in offline]
    by_ids = _post(minilm_fleet, "/v1/embeddings", {"model": "minilm", "input": ids})
    packed = _post(minilm_fleet, "/v1/embeddings", {"model": "minilm", "input": TEXTS, "encoding_format": "base64"})
    for i, want in enumerate(offline):
        _close(by_ids["data"][i]["embedding"], want.outputs.embedding)
        decoded = np.frombuffer(base64.b64decode(packed["data"][i]["embedding"]), dtype="<f4")
        _close(decoded.tolist(), want.outputs.embedding)


def test_fleet_classify_equals_vllm_offline(classifier_fleet: FrontendProc, classifier_llm: Any) -> None:
    offline = classifier_llm.classify(TEXTS, use_tqdm=False)
    body = _post(classifier_fleet, "/classify", {"model": "tiny-classifier", "input": TEXTS})
    labels = ("chat", "code", "math")
    for i, (item, want) in enumerate(zip(body["data"], offline, strict=True)):
        assert item["index"] == i and item["num_classes"] == 3
        _close(item["probs"], want.outputs.probs)
        assert item["label"] == labels[int(np.argmax(want.outputs.probs))]
    assert len({d["label"] for d in body["data"]}) > 1  # the labels differ by text: a real check
    assert body["usage"]["prompt_tokens"] == sum(len(o.prompt_token_ids) for o in offline)


def test_fleet_score_equals_vllm_offline(cross_encoder_fleet: FrontendProc, cross_encoder_llm: Any) -> None:
    outputs = cross_encoder_llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    offline = [o.outputs.score for o in outputs]
    body = _post(cross_encoder_fleet, "/score",
                 {"model": "tiny-cross-encoder", "queries": QUERY, "documents": DOCUMENTS})
    assert [d["index"] for d in body["data"]] == list(range(len(DOCUMENTS)))
    _close([d["score"] for d in body["data"]], offline)
    # One pair, in vLLM's older field names: the pair is [CLS] q [SEP] d [SEP] with token types 0 then 1,
    # so an engine that dropped the token types would score it differently.
    (pair,) = cross_encoder_llm.score(QUERY, DOCUMENTS[2], use_tqdm=False)
    one = _post(cross_encoder_fleet, "/score", {"model": "tiny-cross-encoder", "text_1": QUERY, "text_2": DOCUMENTS[2]})
    _close([one["data"][0]["score"]], [pair.outputs.score])
    assert body["usage"]["prompt_tokens"] == sum(len(o.prompt_token_ids) for o in outputs)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_fleet_rerank_orders_as_vllm_offline_scores(cross_encoder_fleet: FrontendProc, cross_encoder_llm: Any,
                                                    path: str) -> None:
    scores = [o.outputs.score for o in cross_encoder_llm.score(QUERY, DOCUMENTS, use_tqdm=False)]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    body = _post(cross_encoder_fleet, path,
                 {"model": "tiny-cross-encoder", "query": QUERY, "documents": DOCUMENTS, "top_n": 3})
    results = body["results"]
    assert [r["index"] for r in results] == order[:3]
    for r in results:
        assert r["document"]["text"] == DOCUMENTS[r["index"]]
        _close([r["relevance_score"]], [scores[r["index"]]])
