"""Pooling through a real sim engine process over ZMQ: the handshake says runner and tasks, pooled outputs
arrive as float32 arrays in the Outputs message's raw frame, and what the model cannot serve is refused."""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from protocol import ERROR_INVALID, GenerateRequest, Outputs, PoolingParams, Ready, RequestOutput, SamplingParams
from protocol.pooled import to_list
from tests.integration.conftest import SIM
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine

TASKS = ["embed", "token_embed"]  # a causal model on a pooling runner: vLLM's --convert auto gives it an embedding head
TINY_HIDDEN = 128  # the tiny checkpoint's hidden_size


@dataclass
class Pooled:
    output: RequestOutput
    values: Any  # list[float], list[list[float]], or None for an error
    step: int


@pytest.fixture(scope="module")
def pooling_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    engine = start_engine(tmp_path_factory.mktemp("sim-pooling"), *SIM, "--runner", "pooling", "--sim-instant")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def classify_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    engine = start_engine(tmp_path_factory.mktemp("sim-classify"), *SIM, "--convert", "classify", "--sim-instant")
    yield engine
    engine.stop()


def _client(engine: EngineProc) -> Iterator[EngineClient]:
    c = EngineClient(engine.endpoint())
    ready = c.handshake(timeout_s=60)
    assert isinstance(ready, Ready), ready
    yield c
    c.close()


@pytest.fixture
def client(pooling_engine: EngineProc) -> Iterator[EngineClient]:
    yield from _client(pooling_engine)


@pytest.fixture
def classifier(classify_engine: EngineProc) -> Iterator[EngineClient]:
    yield from _client(classify_engine)


def send(c: EngineClient, rid: str, ids: list[int], task: str, **params: Any) -> None:
    c.send(GenerateRequest(rid, ids, SamplingParams(max_tokens=1), time.time(), pooling=PoolingParams(task, **params)))


def collect(c: EngineClient, rids: list[str], timeout_s: float = 30.0) -> dict[str, Pooled]:
    """Each request's one output, its pooled values read from the raw frame of the message it came in."""
    got: dict[str, Pooled] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(rids):
        msg = c.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(msg, Outputs), msg
        for out in msg.outputs:
            assert out.request_id in rids and out.request_id not in got, out
            values = to_list(c.raw_frames, out.pooled) if out.pooled is not None else None
            got[out.request_id] = Pooled(out, values, msg.step)
    return got


def test_ready_says_runner_pooling_and_the_tasks(pooling_engine: EngineProc) -> None:
    c = EngineClient(pooling_engine.endpoint())
    try:
        ready = c.handshake(timeout_s=60)
        assert isinstance(ready, Ready)
        assert (ready.runner, ready.tasks) == ("pooling", TASKS)
    finally:
        c.close()
    pooling_engine.wait_log("runner=pooling tasks=embed,token_embed")


def test_embeddings_of_a_batch_arrive_in_raw_frames_and_repeat_for_the_same_ids(client: EngineClient) -> None:
    texts = {f"e{i}": [100 + i, 200 + i, 300 + i] for i in range(6)}
    texts["again"] = texts["e0"]
    # Paused, the engine holds what arrives and adds it all on resume: one step pools every request.
    assert client.utility("pause", mode="keep").ok
    for rid, ids in texts.items():
        send(client, rid, ids, "embed")
    assert client.utility("resume").ok
    got = collect(client, list(texts))
    for p in got.values():
        out = p.output
        assert (out.finish_reason, out.new_token_ids, out.error) == ("stop", [], None)
        assert len(p.values) == TINY_HIDDEN and math.isclose(math.fsum(v * v for v in p.values), 1.0, rel_tol=1e-5)
    assert got["again"].values == got["e0"].values
    assert got["e1"].values != got["e0"].values
    # Seven arrays in one message: each ref points at its own bytes of the one raw frame.
    assert len({p.step for p in got.values()}) == 1
    assert sorted(p.output.pooled.offset for p in got.values()) == [i * 4 * TINY_HIDDEN for i in range(7)]


def test_token_rows(client: EngineClient) -> None:
    ids = [11, 12, 13, 14, 15]
    send(client, "rows", ids, "token_embed")
    assert [len(row) for row in collect(client, ["rows"])["rows"].values] == [TINY_HIDDEN] * len(ids)


def test_classify_a_pair_and_token_labels(classify_engine: EngineProc, classifier: EngineClient) -> None:
    """--convert classify gives the causal model a classifier's head, and its tasks."""
    classify_engine.wait_log("runner=pooling tasks=classify,token_classify")
    ids = [11, 12, 13, 14, 15]
    send(classifier, "single", ids, "classify")
    send(classifier, "pair", ids, "classify", token_type_split=3)
    send(classifier, "raw", ids, "classify", token_type_split=3, use_activation=False)
    send(classifier, "rows", ids, "token_classify")
    send(classifier, "embed", ids, "embed")
    got = collect(classifier, ["single", "pair", "raw", "rows", "embed"])
    pair = got["pair"].values
    assert len(pair) == 2 and math.isclose(sum(pair), 1.0, rel_tol=1e-5)  # tiny has no labels: two, softmax
    assert pair != got["single"].values
    exps = [math.exp(v) for v in got["raw"].values]
    assert pair == pytest.approx([e / sum(exps) for e in exps], rel=1e-5)
    assert [len(row) for row in got["rows"].values] == [2] * len(ids)
    refused = got["embed"].output
    assert refused.error_kind == ERROR_INVALID and refused.error is not None
    assert "pooling.task='embed' is not served by this engine's model: it serves ['classify', 'token_classify']" in (
        refused.error)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GenerateRequest("gen", [1, 2, 3], SamplingParams(max_tokens=4), 0.0),
         "task 'generate' is not served: this engine runs a pooling model (tasks ['embed', 'token_embed'])"),
        (GenerateRequest("score", [1, 2], SamplingParams(max_tokens=1), 0.0, pooling=PoolingParams("score")),
         "pooling.task='score' is not served by this engine's model: it serves ['embed', 'token_embed']"),
        (GenerateRequest("cls", [1, 2], SamplingParams(max_tokens=1), 0.0, pooling=PoolingParams("classify")),
         "pooling.task='classify' is not served by this engine's model: it serves ['embed', 'token_embed']"),
        (GenerateRequest("dims", [1, 2], SamplingParams(max_tokens=1), 0.0, pooling=PoolingParams("embed", 8)),
         "Model 'tiny' does not support Matryoshka embeddings; dimensions must be unset (received dimensions=8)."),
        (GenerateRequest("long", list(range(1, 4098)), SamplingParams(max_tokens=1), 0.0,
                         pooling=PoolingParams("embed")),
         "prompt_token_ids has 4097 tokens; this engine's max_model_len is 4096, so at most 4096 fit"),
    ],
)
def test_refusals_name_the_task_and_what_is_served(client: EngineClient, request_: GenerateRequest,
                                                    message: str) -> None:
    client.send(request_)
    out = collect(client, [request_.request_id])[request_.request_id].output
    assert (out.finish_reason, out.error_kind, out.pooled) == ("error", ERROR_INVALID, None)
    assert out.error is not None and message in out.error
    # The engine still serves.
    send(client, "after", [1, 2, 3], "embed")
    assert collect(client, ["after"])["after"].output.finish_reason == "stop"


def test_a_generating_engine_says_so_and_refuses_pooling(tmp_path_factory: pytest.TempPathFactory) -> None:
    engine = start_engine(tmp_path_factory.mktemp("sim-generate"), *SIM, "--sim-instant")
    c = EngineClient(engine.endpoint())
    try:
        ready = c.handshake(timeout_s=60)
        assert isinstance(ready, Ready) and (ready.runner, ready.tasks) == ("generate", ["generate"])
        send(c, "p", [1, 2, 3], "embed")
        out = collect(c, ["p"])["p"].output
        assert (out.finish_reason, out.error_kind) == ("error", ERROR_INVALID)
        assert out.error == "pooling.task='embed' is not served by this engine's model: it serves ['generate']"
    finally:
        c.close()
        assert engine.stop() == 0, engine.log()
