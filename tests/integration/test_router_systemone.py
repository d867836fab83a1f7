"""The System One API through real processes: a router with one managed sim worker per family
(tiny-classifier, minilm, tiny-cross-encoder: our engine `--backend sim --runner pooling` and a
frontend each, started by the router), called over plain HTTP. Each family's answer is what its worker
itself answers; bad bodies are 400s naming the field; a name the listener does not publish answers as
an unknown one; the listener's keys apply; a listener that does not publish the API has no route to
it; and the workers' own APIs are never reachable on a listener's port."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from services.router.config import ConfigError, parse_config
from tests.support.procs import HttpProc, free_port_block, managed_worker_key

KEY = {"authorization": "Bearer k"}
MODELS = ("cls", "emb", "rr")
CONFIG = """
listeners:
  - {port: PUBLIC, host: 127.0.0.1, api_keys: [k], apis: {models: {}, systemone: {models: [cls, emb, rr]}}}
  - {port: OTHER, host: 127.0.0.1, name: other}
pools:
  chat: {model: tiny, replicas: [{url: "http://127.0.0.1:9"}]}
entries:
  # Its signals name the deployments: they start whether or not published models start their own.
  auto:
    signals:
      - {name: c, type: classifier, deployment: cls, labels: [code]}
      - {name: e, type: embedding, deployment: emb, examples: [x]}
      - {name: r, type: rerank, deployment: rr, examples: [x]}
    decisions: [{name: any, when: {any: [c, e, r]}, pools: [chat]}]
    default: [chat]
deployments:
  cls: {model: tiny-classifier, tasks: [classify], managed: {backend: sim}}
  emb: {model: minilm, tasks: [embed], managed: {backend: sim}}
  rr: {model: tiny-cross-encoder, tasks: [rerank], managed: {backend: sim}}
  idle: {model: tiny-classifier, tasks: [classify], managed: {backend: sim}}
"""
# Until the config reader reads `apis` as a mapping, the router is started with the published models set
# on the parsed config (the same objects the reader builds), by this launcher.
LAUNCHER = """
import dataclasses, logging, sys, yaml
from services.router.config import parse_config
from services.router.server import run, run_loop
if __name__ == "__main__":  # the body workers are spawned: they import this file, and must not run it
    raw = yaml.safe_load(open(sys.argv[1]))
    published = {}
    for i, listener in enumerate(raw["listeners"]):
        if isinstance(listener.get("apis"), dict):
            published[i] = tuple(listener["apis"]["systemone"]["models"])
            listener["apis"] = list(listener["apis"])
    config = parse_config(raw, sys.argv[1])
    listeners = tuple(dataclasses.replace(l, systemone=published.get(i, ())) for i, l in enumerate(config.listeners))
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run_loop(run(dataclasses.replace(config, listeners=listeners))))
"""


@dataclass
class Fleet:
    router: HttpProc
    other: str  # the second listener's URL
    workers: dict[str, tuple[str, str]]  # deployment -> (its worker's URL, its API key)

    def worker(self, name: str, path: str, body: dict[str, Any]) -> httpx.Response:
        url, key = self.workers[name]
        return httpx.post(url + path, json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)


def _post(url: str, body: Any, path: str = "/v1/systemone", headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=KEY if headers is None else headers, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("systemone")
    port = free_port_block(2, spread=0)
    text = CONFIG.replace("PUBLIC", str(port)).replace("OTHER", str(port + 1))
    path = tmp / "router.yaml"
    path.write_text(text)
    try:
        parse_config(yaml.safe_load(text))
        cmd = [sys.executable, "-m", "services.router", "--config", str(path)]
    except ConfigError:  # the mapping form not read yet
        (tmp / "launch.py").write_text(LAUNCHER)
        cmd = [sys.executable, str(tmp / "launch.py"), str(path)]
    log_path = tmp / "router.log"
    with open(log_path, "wb") as log:
        router = HttpProc(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), port, log_path)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                ready = httpx.get(router.url + "/ready", headers=KEY, timeout=5)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert router.proc.poll() is None and time.monotonic() < deadline, router.log()
            time.sleep(0.2)
        workers = {}
        for name in MODELS:
            [worker] = ready.json()["deployments"][name]["workers"]
            workers[name] = (worker["url"], managed_worker_key(worker["url"]))
        yield Fleet(router, f"http://127.0.0.1:{port + 1}", workers)
    finally:
        router.stop()


def test_a_classifier_answers_what_its_worker_answers_for_a_batch(fleet: Fleet) -> None:
    texts = ["fix my python code", "what is 2 + 2", ""]
    answer = _post(fleet.router.url, {"model": "cls", "input": texts})
    assert answer.status_code == 200, answer.text
    own = fleet.worker("cls", "/classify", {"model": "tiny-classifier", "input": texts})
    assert own.status_code == 200, own.text
    body = answer.json()
    assert (body["object"], body["model"], body["family"], body["deployment"], body["routing"]) == \
        ("systemone.classification", "cls", "classifier", "cls", None)
    assert body["usage"]["prompt_tokens"] == own.json()["usage"]["prompt_tokens"] > 0
    for row, expected in zip(body["data"], sorted(own.json()["data"], key=lambda r: r["index"]), strict=True):
        assert list(row["probs"]) == ["chat", "code", "math"]  # the checkpoint's id2label
        assert list(row["probs"].values()) == expected["probs"]
        assert row["label"] == max(row["probs"], key=row["probs"].get) and row["probability"] == max(expected["probs"])


def test_an_embedding_model_answers_its_workers_vectors(fleet: Fleet) -> None:
    answer = _post(fleet.router.url, {"model": "emb", "input": ["hello", "world"]})
    own = fleet.worker("emb", "/v1/embeddings", {"model": "minilm", "input": ["hello", "world"]})
    assert answer.status_code == own.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "systemone.embedding" and body["family"] == "embedding"
    assert [r["embedding"] for r in body["data"]] == [r["embedding"] for r in own.json()["data"]]
    assert body["usage"]["prompt_tokens"] == own.json()["usage"]["prompt_tokens"]
    single = _post(fleet.router.url, {"model": "emb", "input": "hello"}).json()
    assert single["data"] == [body["data"][0]]


def test_a_cross_encoder_answers_its_workers_scores_in_document_order(fleet: Fleet) -> None:
    documents = ["python is a language", "bread needs flour", "snakes are reptiles"]
    answer = _post(fleet.router.url, {"model": "rr", "query": "python", "documents": documents})
    own = fleet.worker("rr", "/rerank", {"model": "tiny-cross-encoder", "query": "python", "documents": documents})
    assert answer.status_code == own.status_code == 200, answer.text
    body = answer.json()
    by_index = {r["index"]: r["relevance_score"] for r in own.json()["results"]}
    assert body["data"] == [{"index": i, "score": by_index[i]} for i in range(3)]
    assert body["usage"]["prompt_tokens"] == own.json()["usage"]["total_tokens"]


def test_the_decisions_alias_answers_as_systemone(fleet: Fleet) -> None:
    body = {"model": "cls", "input": ["alias"]}
    assert _post(fleet.router.url, body, "/v1/decisions").json() == _post(fleet.router.url, body).json()


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"), ({"model": "cls", "input": []}, "input"), ({"model": "cls", "input": [1]}, "input[0]"),
    ({"model": "cls", "input": "x", "query": "q"}, "query"), ({"model": "rr", "query": "q"}, "documents"),
    ({"model": "emb", "input": "x", "dimensions": 8}, "dimensions")])
def test_bad_bodies_are_400s_naming_the_field(fleet: Fleet, body: dict[str, Any], param: str) -> None:
    answer = _post(fleet.router.url, body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_an_unpublished_name_answers_as_an_unknown_one(fleet: Fleet) -> None:
    unpublished = _post(fleet.router.url, {"model": "idle", "input": "x"})
    unknown = _post(fleet.router.url, {"model": "nothing", "input": "x"})
    assert unpublished.status_code == unknown.status_code == 404
    assert unpublished.json() == {"error": {**unknown.json()["error"],
                                            "message": unknown.json()["error"]["message"].replace("nothing", "idle")}}
    assert unknown.json()["error"]["message"] == "The model `nothing` does not exist; available: cls, emb, rr"
    listed = httpx.get(fleet.router.url + "/v1/systemone/models", headers=KEY, timeout=10).json()["data"]
    assert [(m["id"], m["family"], m["routing"]) for m in listed] == [
        ("cls", "classifier", False), ("emb", "embedding", False), ("rr", "cross_encoder", False)]


def test_the_listeners_keys_apply_and_another_listener_does_not_publish_it(fleet: Fleet) -> None:
    body = {"model": "cls", "input": "x"}
    assert _post(fleet.router.url, body, headers={}).status_code == 401
    assert _post(fleet.router.url, body, headers={"authorization": "Bearer wrong"}).status_code == 401
    assert _post(fleet.other, body, headers={}).status_code == 404
    assert httpx.get(fleet.other + "/v1/systemone/models", timeout=10).status_code == 404


WORKER_APIS = [("cls", "/classify", {"model": "tiny-classifier", "input": "x"}),
               ("emb", "/v1/embeddings", {"model": "minilm", "input": "x"}),
               ("rr", "/rerank", {"model": "tiny-cross-encoder", "query": "q", "documents": ["d"]}),
               ("rr", "/score", {"model": "tiny-cross-encoder", "text_1": "q", "text_2": "d"}),
               ("cls", "/pooling", {"model": "tiny-classifier", "input": "x"}),
               ("emb", "/v2/embed", {"model": "minilm", "texts": ["x"], "input_type": "search_query"}),
               ("cls", "/tokenize", {"model": "tiny-classifier", "prompt": "x"})]


@pytest.mark.parametrize(("name", "path", "body"), WORKER_APIS, ids=[p for _, p, _ in WORKER_APIS])
def test_a_workers_api_is_never_published_on_a_listener(fleet: Fleet, name: str, path: str,
                                                        body: dict[str, Any]) -> None:
    assert fleet.worker(name, path, body).status_code != 404  # the worker serves it on its own port ...
    assert _post(fleet.router.url, body, path).status_code == 404  # ... the listener does not
