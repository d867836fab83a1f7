"""The real compose file run by deploy/compose/run.py as local processes (engines on the sim backend,
compose.sim.yaml), traffic through the router with the openai and anthropic SDKs, and teardown."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support.procs import group_gone

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"


@dataclass
class Fleet:
    runner: subprocess.Popen[str]
    router_url: str
    pids: dict[str, int]
    lines: list[str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("compose")
    ports_file = tmp / "ports.json"
    runner = subprocess.Popen(
        [sys.executable, str(COMPOSE / "run.py"), str(COMPOSE / "compose.yaml"), str(COMPOSE / "compose.sim.yaml"),
         "--ports-file", str(ports_file), "--volumes-dir", str(tmp / "volumes"), "--grace", "10"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    events: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert runner.stdout is not None
        for line in runner.stdout:
            lines.append(line)
            events.put(line)
        events.put("")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while True:
        line = events.get(timeout=max(0.1, deadline - time.monotonic()))
        if line.startswith("run | all services up"):
            break
        assert line and time.monotonic() < deadline, "the fleet did not come up:\n" + "".join(lines[-60:])
    pids = {m[1]: int(m[2]) for m in (re.match(r"run \| started (\S+) \(pid (\d+)\)", x) for x in lines) if m}
    router_port = json.loads(ports_file.read_text())["router"]["8080"]
    yield Fleet(runner, f"http://127.0.0.1:{router_port}", pids, lines)
    if runner.poll() is None:
        os.killpg(runner.pid, signal.SIGKILL)
    runner.wait()
    reader.join(10)
    assert runner.stdout is not None
    runner.stdout.close()


def test_chat_and_stream_through_the_router(fleet: Fleet) -> None:
    with openai.OpenAI(base_url=fleet.router_url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8)
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 8 and reply.choices[0].message.content
        chunks = list(client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_messages_through_the_router(fleet: Fleet) -> None:
    with anthropic.Anthropic(base_url=fleet.router_url, api_key="unused", max_retries=0, timeout=30) as client:
        message = client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
        assert message.content[0].type == "text" and message.content[0].text


def test_sigterm_tears_everything_down(fleet: Fleet) -> None:
    assert set(fleet.pids) == {"engine-0", "engine-1", "frontend", "router"}
    assert not any(group_gone(pid, timeout_s=0) for pid in fleet.pids.values())
    fleet.runner.send_signal(signal.SIGTERM)
    assert fleet.runner.wait(30) == 0, "".join(fleet.lines[-40:])
    # each service's whole process group: its children count too
    assert [name for name, pid in fleet.pids.items() if not group_gone(pid)] == []
    assert fleet.lines[-1].startswith("run | stopped")
