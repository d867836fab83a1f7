"""The real compose file run by deploy/compose/run.py as local processes (engines on the sim backend,
compose.sim.yaml), traffic through the router with the openai and anthropic SDKs, and teardown."""
from __future__ import annotations

import signal
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.support.compose import ComposeRun, start_compose
from tests.support.procs import group_gone


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeRun]:
    run = start_compose(tmp_path_factory.mktemp("compose"), "compose.yaml", "compose.sim.yaml")
    yield run
    run.close()


def test_chat_and_stream_through_the_router(fleet: ComposeRun) -> None:
    with openai.OpenAI(base_url=fleet.router_url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8)
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 8 and reply.choices[0].message.content
        chunks = list(client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_messages_through_the_router(fleet: ComposeRun) -> None:
    with anthropic.Anthropic(base_url=fleet.router_url, api_key="unused", max_retries=0, timeout=30) as client:
        message = client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
        assert message.content[0].type == "text" and message.content[0].text


def test_sigterm_tears_everything_down(fleet: ComposeRun) -> None:
    assert set(fleet.pids) == {"engine-0", "engine-1", "frontend", "router"}
    assert not any(group_gone(pid, timeout_s=0) for pid in fleet.pids.values())
    fleet.runner.send_signal(signal.SIGTERM)
    assert fleet.runner.wait(30) == 0, fleet.output()
    # each service's whole process group: its children count too
    assert [name for name, pid in fleet.pids.items() if not group_gone(pid)] == []
    assert fleet.lines[-1].startswith("run | stopped")
