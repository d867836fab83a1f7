"""vLLM tests run the engine in-process and never reach a model hub; both are
read from the environment, so set them before any test imports vllm."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import checkpoints

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# 512 bytes of KV per token (2 layers x K,V x 2 heads x 32 dims x bf16): 4 MiB
# holds 8192 tokens, far more than max_model_len.
KV_CACHE_BYTES = 4 * 2**20


@pytest.fixture(scope="session")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """vLLM's own offline engine on the tiny model: the reference our engine is compared with."""
    vllm = pytest.importorskip("vllm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEET_CACHE_DIR", str(tmp_path_factory.mktemp("fleet-cache")))
        path = checkpoints.resolve("tiny", weights=True)
    engine = vllm.LLM(model=str(path), max_model_len=512, kv_cache_memory_bytes=KV_CACHE_BYTES,
                      enforce_eager=True, dtype="bfloat16", seed=0)
    yield engine
    del engine
