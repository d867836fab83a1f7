"""Engine mode as a real process: `router -e tiny-classifier tiny-cross-encoder minilm --engine-backend sim`
with no routing file serves the System One API for those models on managed sim workers and nothing of chat;
a routing file given beside -e gives its first listener's port and keys and is otherwise left inactive."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.procs import HttpProc, free_port_block, start_router

MODELS = ("tiny-classifier", "tiny-cross-encoder", "minilm")
READY_S = 240  # three managed sim workers (an engine and a frontend each) on a loaded test host
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}

ROUTING = """
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{key}]}}]
pools:
  chat: {{model: tiny, replicas: [{{url: "http://127.0.0.1:9"}}]}}
entries:
  auto: {{default: [chat]}}
"""
KEY = "file-key"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    """The engine-mode router with no routing file, ready (shared: no test may stop it)."""
    tmp = tmp_path_factory.mktemp("engine-mode")
    port = free_port_block(1, spread=0)
    log_path = tmp / f"router-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.router", "-e", *MODELS, "--engine-backend", "sim",
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    router = HttpProc(proc, port, log_path)
    try:
        router.wait_ready(timeout_s=READY_S)
        yield router
    finally:
        assert router.stop() == 0, router.log()


@pytest.fixture(scope="module")
def engine_with_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    """An engine-mode router given a routing file: its listener's port and key serve minilm."""
    router = start_router(tmp_path_factory.mktemp("engine-file"), ROUTING.format(key=KEY), "-e", "minilm",
                          "--engine-backend", "sim")
    try:
        router.wait_ready(timeout_s=READY_S)
        yield router
    finally:
        assert router.stop() == 0, router.log()


def test_engine_mode_needs_no_routing_file_says_so_and_serves_no_chat(engine: HttpProc) -> None:
    log = engine.log()
    assert ("engine mode: System One for tiny-classifier (classifier, tiny-classifier), tiny-cross-encoder "
            "(cross_encoder, tiny-cross-encoder), minilm (embedding, minilm); no chat backend") in log
    assert f"listener engine: http://127.0.0.1:{engine.port} (systemone; no API keys: open)" in log
    assert "router mode" not in log and "routing file" not in log
    chat = httpx.post(engine.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert chat.status_code == 404, chat.text
    assert httpx.get(engine.url + "/v1/models", timeout=10).status_code == 404


def test_a_routing_file_beside_engine_mode_is_loaded_and_inactive(engine_with_file: HttpProc) -> None:
    router = engine_with_file
    log = router.log()
    config = router.log_path.parent / f"router-{router.port}.yaml"
    assert f"engine mode: routing file {config} loaded and inactive (1 entries, 1 pools not served)" in log
    assert "engine mode: System One for minilm (embedding, minilm); no chat backend" in log
    # Its first listener's port (the router was given no --port) and its key, not its chat entry.
    assert f"listener engine: http://127.0.0.1:{router.port} (systemone; 1 API key(s))" in log
    assert httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 401
    chat = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10,
                      headers={"authorization": f"Bearer {KEY}"})
    assert chat.status_code == 404, chat.text


# ---- the System One calls: they pass once the System One API (listeners/systemone.py) and the runtime's
# demand for published models (runtime/demand.py) are in ----

def _system_one(router: HttpProc, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}"} if key else None
    r = httpx.post(router.url + "/v1/systemone", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    answer = dict(r.json())
    assert answer["model"] == body["model"] and answer["deployment"] == body["model"] and answer["routing"] is None
    assert answer["usage"]["prompt_tokens"] > 0
    return answer


def test_engine_mode_serves_system_one_for_each_model(engine: HttpProc) -> None:
    ready = engine.wait_ready(timeout_s=READY_S)
    assert set(ready["deployments"]) == set(MODELS), ready  # each published model started its worker

    listed = httpx.get(engine.url + "/v1/systemone/models", timeout=10)
    assert listed.status_code == 200, listed.text
    assert {(m["id"], m["family"], m["routing"]) for m in listed.json()["data"]} == {
        ("tiny-classifier", "classifier", False), ("tiny-cross-encoder", "cross_encoder", False),
        ("minilm", "embedding", False)}

    classified = _system_one(engine, {"model": "tiny-classifier", "input": "def f(): pass"})
    assert (classified["object"], classified["family"]) == ("systemone.classification", "classifier")
    [row] = classified["data"]
    assert set(row["probs"]) == {"chat", "code", "math"} and row["label"] in row["probs"]

    scored = _system_one(engine, {"model": "tiny-cross-encoder", "query": "python",
                                  "documents": ["a snake", "a language"]})
    assert (scored["object"], scored["family"]) == ("systemone.scores", "cross_encoder")
    assert [row["index"] for row in scored["data"]] == [0, 1]

    embedded = _system_one(engine, {"model": "minilm", "input": ["hello", "world"]})
    assert (embedded["object"], embedded["family"]) == ("systemone.embedding", "embedding")
    assert [len(row["embedding"]) for row in embedded["data"]] == [384, 384]


def test_engine_mode_with_a_routing_file_serves_system_one_under_its_key(engine_with_file: HttpProc) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    assert set(engine_with_file.wait_ready(headers, READY_S)["deployments"]) == {"minilm"}
    assert httpx.post(engine_with_file.url + "/v1/systemone", json={"model": "minilm", "input": "x"},
                      timeout=10).status_code == 401
    embedded = _system_one(engine_with_file, {"model": "minilm", "input": "hello"}, KEY)
    assert embedded["object"] == "systemone.embedding"
