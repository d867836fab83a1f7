"""The semantic cache's paraphrase hit with a real embedding model: a router process whose embedder is a
managed vLLM deployment of all-MiniLM-L6-v2 (the `minilm` checkpoint) answers a paraphrase of a cached
question from cache, and a different question from upstream."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cache_fleet import Fleet

CONFIG = """
listeners:
  - {port: {port}, host: 127.0.0.1, api_keys: [key-a, key-b]}
pools:
  chat: {model: m, replicas: [{url: "BACKEND"}]}
deployments:
  emb:
    model: minilm
    tasks: [embed]
    managed: {backend: vllm, engine_args: [--max-model-len, "256", --kv-cache-bytes, "4194304"]}
store: {backend: sqlite, path: "DB"}
entries:
  assistant:
    default: [chat]
    plugins: [{type: semantic_cache, embedder: emb, timeout_s: 30}]
"""


def test_a_paraphrase_hits_and_another_question_misses(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    fleet = Fleet(tmp_path, CONFIG)
    try:
        client = fleet.openai()

        def ask(text: str) -> dict[str, str]:
            raw = client.chat.completions.with_raw_response.create(
                model="assistant", messages=[{"role": "user", "content": text}])
            raw.parse()
            return dict(raw.headers)

        assert ask("how can I reset my password")["x-router-cache"] == "miss"
        fleet.wait_stored(1)
        paraphrase = ask("How do I reset my password?")
        assert paraphrase["x-router-cache"] == "hit" and paraphrase["x-router-cache-match"] == "semantic"
        assert 0.92 <= float(paraphrase["x-router-cache-similarity"]) < 1.0
        assert ask("What is the capital of France?")["x-router-cache"] == "miss"
        assert fleet.calls() == 2
        assert fleet.outcome("hit_semantic") == 1
    finally:
        fleet.stop()
