"""Our engine with the real vLLM backend and `--runner pooling` on `minilm` (all-MiniLM-L6-v2, real weights), over tcp
loopback: the handshake says what vLLM serves, embeddings equal vLLM's offline LLM.embed for the same token
ids (and the sentence-transformers recipe, mean pooling then L2 normalization, run by transformers), and
what the model cannot serve is refused with vLLM's reasons. The engine and the reference are
tests/vllm/conftest.py's `minilm_engine` and `minilm_llm`, shared across tests/vllm with the other pooling
modules (this module's client is one more peer of the engine test_pooling_vllm's frontend uses)."""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from protocol import ERROR_INVALID, GenerateRequest, Outputs, PoolingParams, Ready, RequestOutput, SamplingParams
from protocol.pooled import to_list
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

MAX_MODEL_LEN = 256  # conftest.POOLING_MAX_MODEL_LEN["minilm"], which test_ready_says_what_vllm_serves checks
# [CLS] ... [SEP] ids of the MiniLM (BERT uncased) vocabulary: "hello world", "a cat sat on the mat", ...
PROMPTS = [
    [101, 7592, 2088, 102],
    [101, 1037, 4937, 2938, 2006, 1996, 13523, 102],
    [101, 2129, 2079, 1045, 17542, 1037, 5219, 2153, 1029, 102],
    [101, *range(2000, 2200), 102],
]


def minilm() -> Path:
    return checkpoints.resolve("minilm")


@pytest.fixture(scope="module")
def engine(minilm_engine: EngineProc) -> EngineProc:
    return minilm_engine


@pytest.fixture(scope="module")
def reference(minilm_llm: Any) -> Any:
    """vLLM's own offline pooling engine on the same checkpoint and limits."""
    return minilm_llm


@pytest.fixture
def client(engine: EngineProc) -> Iterator[EngineClient]:
    c = EngineClient(engine.endpoint())
    ready = c.handshake(timeout_s=120)
    assert isinstance(ready, Ready) and ready.backend == "vllm", ready
    yield c
    c.close()


def send(c: EngineClient, rid: str, ids: list[int], task: str, **params: Any) -> None:
    c.send(GenerateRequest(rid, ids, SamplingParams(max_tokens=1), time.time(), pooling=PoolingParams(task, **params)))


def collect(c: EngineClient, rids: list[str], timeout_s: float = 120.0) -> dict[str, tuple[RequestOutput, Any]]:
    got: dict[str, tuple[RequestOutput, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(rids):
        msg = c.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(msg, Outputs), msg
        for out in msg.outputs:
            got[out.request_id] = (out, to_list(c.raw_frames, out.pooled) if out.pooled is not None else None)
    return got


def test_ready_says_what_vllm_serves(engine: EngineProc) -> None:
    c = EngineClient(engine.endpoint())
    try:
        ready = c.handshake(timeout_s=120)
        assert isinstance(ready, Ready)
        assert ready.runner == "pooling" and sorted(ready.tasks) == ["embed", "token_embed"]
        assert ready.max_model_len == MAX_MODEL_LEN
    finally:
        c.close()
    engine.wait_log("runner=pooling")


def test_embeddings_equal_vllm_offline_embed(client: EngineClient, reference: Any) -> None:
    # Held while paused and added together on resume: one batch, as the offline engine runs them.
    assert client.utility("pause", mode="keep").ok
    for i, ids in enumerate(PROMPTS):
        send(client, f"e{i}", ids, "embed")
    assert client.utility("resume").ok
    ours = collect(client, [f"e{i}" for i in range(len(PROMPTS))])
    theirs = reference.embed([{"prompt_token_ids": ids} for ids in PROMPTS], use_tqdm=False)
    for i, expected in enumerate(theirs):
        out, values = ours[f"e{i}"]
        assert (out.finish_reason, out.new_token_ids, out.pooled.shape) == ("stop", [], [384])  # type: ignore[union-attr]
        assert values == pytest.approx(list(expected.outputs.embedding), abs=1e-5)
    # The sentence-transformers recipe of this checkpoint (mean pooling, normalize), in float32.
    for i, vector in enumerate(sentence_transformers_embeddings(PROMPTS)):
        ours_i = ours[f"e{i}"][1]
        dot = math.fsum(a * b for a, b in zip(ours_i, vector, strict=True))
        cosine = dot / math.sqrt(math.fsum(b * b for b in vector))  # ours is a unit vector
        assert cosine > 1 - 1e-3, (i, cosine)


def test_token_embed_and_raw_values(client: EngineClient, reference: Any) -> None:
    ids = PROMPTS[1]
    send(client, "rows", ids, "token_embed")
    send(client, "raw", ids, "embed", use_activation=False)
    got = collect(client, ["rows", "raw"])
    rows = got["rows"][1]
    assert len(rows) == len(ids) and all(len(r) == 384 for r in rows)
    raw = got["raw"][1]
    assert not math.isclose(math.fsum(v * v for v in raw), 1.0, rel_tol=1e-2)  # not normalized
    theirs = reference.embed([{"prompt_token_ids": ids}], use_tqdm=False, pooling_params=_vllm_params(False))
    assert raw == pytest.approx(list(theirs[0].outputs.embedding), abs=1e-4)


@pytest.mark.parametrize(
    ("task", "ids", "params", "message"),
    [
        ("classify", PROMPTS[0], {}, "pooling.task='classify' is not served by this engine's model: it serves"),
        ("embed", PROMPTS[0], {"dimensions": 8},
         "pooling.dimensions: Model 'minilm' does not support Matryoshka embeddings; dimensions must be unset "
         "(received dimensions=8)."),
        ("embed", [101, *range(2000, 2000 + MAX_MODEL_LEN), 102], {},
         f"prompt_token_ids has {MAX_MODEL_LEN + 2} tokens; this engine's max_model_len is {MAX_MODEL_LEN}"),
    ],
)
def test_refusals(client: EngineClient, task: str, ids: list[int], params: dict[str, Any], message: str) -> None:
    send(client, "bad", ids, task, **params)
    out, values = collect(client, ["bad"])["bad"]
    assert (out.finish_reason, out.error_kind, values) == ("error", ERROR_INVALID, None)
    assert out.error is not None and message in out.error, out.error
    client.generate("gen", ids[:4], max_tokens=2)
    out = collect(client, ["gen"])["gen"][0]
    assert (out.finish_reason, out.error_kind) == ("error", ERROR_INVALID)
    assert out.error is not None and "task 'generate' is not served" in out.error


def _vllm_params(use_activation: bool) -> Any:
    from vllm.pooling_params import PoolingParams as VllmPooling

    return VllmPooling(use_activation=use_activation)


def sentence_transformers_embeddings(prompts: list[list[int]]) -> list[list[float]]:
    """all-MiniLM-L6-v2 as sentence-transformers runs it (modules.json: Transformer, mean Pooling,
    Normalize), one text at a time, with transformers in float32."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(minilm()), torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            mean = hidden.mean(dim=0)
            out.append((mean / mean.norm()).tolist())
    return out
