"""End to end on the real vLLM backend: a managed frontend (it starts its own headless vllm engine)
answering the official openai SDK, streamed and not."""
from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.procs import FrontendProc, free_port_block, start_frontend

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    pytest.importorskip("vllm")
    engine_port = free_port_block(1)
    fe = start_frontend(tmp_path_factory.mktemp("vllm-fe"), "--backend", "vllm", "--data-parallel-size-local", "1",
                        "--engine-port", str(engine_port), "--engine-arg=--max-model-len=1024",
                        f"--engine-arg=--kv-cache-bytes={16 * 2**20}")
    yield fe
    assert fe.stop() == 0, fe.log()


def test_chat_and_completion_through_vllm(frontend: FrontendProc) -> None:
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                          max_tokens=24, temperature=0)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 24  # type: ignore[union-attr]
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                              max_tokens=24, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same tokens both ways
    done = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8  # type: ignore[union-attr]
    client.close()
