"""Our engine with the real vLLM backend on the `tiny-cross-encoder` checkpoint (random-weight BERT, one
label, the MiniLM tokenizer): a (query, document) pair sent as token ids with its token-type split scores as
vLLM's offline LLM.score scores the same texts, and a single text classifies as LLM.classify does. The
engine and the reference are tests/vllm/conftest.py's `cross_encoder_engine` and `cross_encoder_llm`,
shared across tests/vllm with test_pooling_vllm (whose frontend is another peer of the same engine)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from protocol import GenerateRequest, Outputs, PoolingParams, Ready, SamplingParams
from protocol.pooled import to_list
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PAIRS = [("what is a cat", "a cat is a small animal"), ("capital of france", "paris is the capital of france"),
         ("how to bake bread", "the stock market fell today")]


@pytest.fixture(scope="module")
def cross_encoder() -> Path:
    pytest.importorskip("vllm")
    return checkpoints.resolve("tiny-cross-encoder", weights=True)


@pytest.fixture(scope="module")
def engine(cross_encoder_engine: EngineProc) -> EngineProc:
    return cross_encoder_engine


@pytest.fixture(scope="module")
def reference(cross_encoder_llm: Any) -> Any:
    return cross_encoder_llm


def encode_pair(path: Path, query: str, doc: str | None = None) -> tuple[list[int], int | None]:
    """Token ids of a text or a pair, and a pair's split: where its token types turn to 1."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()  # MiniLM's tokenizer.json pads every text to 128 tokens; vLLM's tokenizer call does not
    tokenizer.no_truncation()
    enc = tokenizer.encode(query, doc)
    return list(enc.ids), (enc.type_ids.index(1) if doc is not None else None)


def run(c: EngineClient, requests: dict[str, tuple[list[int], int | None]]) -> dict[str, list[float]]:
    for rid, (ids, split) in requests.items():
        c.send(GenerateRequest(rid, ids, SamplingParams(max_tokens=1), time.time(),
                               pooling=PoolingParams("classify", token_type_split=split)))
    got: dict[str, list[float]] = {}
    deadline = time.monotonic() + 120
    while len(got) < len(requests):
        msg = c.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(msg, Outputs), msg
        for out in msg.outputs:
            assert out.finish_reason == "stop" and out.pooled is not None, out
            got[out.request_id] = to_list(c.raw_frames, out.pooled)  # type: ignore[assignment]
    return got


def test_pairs_score_and_texts_classify_as_vllm_offline(engine: EngineProc, reference: Any,
                                                        cross_encoder: Path) -> None:
    c = EngineClient(engine.endpoint())
    try:
        ready = c.handshake(timeout_s=120)
        assert isinstance(ready, Ready) and ready.runner == "pooling" and "classify" in ready.tasks, ready
        requests = {f"pair{i}": encode_pair(cross_encoder, q, d) for i, (q, d) in enumerate(PAIRS)}
        # The same ids without the split: token types all 0, so the score must differ if types are honoured.
        requests["untyped0"] = (requests["pair0"][0], None)
        requests["text"] = encode_pair(cross_encoder, PAIRS[0][0])
        got = run(c, requests)
    finally:
        c.close()
    scores = reference.score([q for q, _ in PAIRS], [d for _, d in PAIRS], use_tqdm=False)
    for i, expected in enumerate(scores):
        assert got[f"pair{i}"] == pytest.approx([expected.outputs.score], abs=1e-5)
    assert abs(got["untyped0"][0] - got["pair0"][0]) > 1e-4
    (classified,) = reference.classify([{"prompt_token_ids": requests["text"][0]}], use_tqdm=False)
    assert got["text"] == pytest.approx(list(classified.outputs.probs), abs=1e-5)
