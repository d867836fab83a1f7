"""Native System One recipes through real processes: one router whose recipes (`api: systemone`)
escalate over three managed sim classifiers (`fast`, `second`, `third`: the same checkpoint, each worker
with its own `--seed`, so their answers differ), a standalone engine-mode router declared as an attached
stage (`api: systemone`), and a judge pool (a frontend over a sim engine scripted to reply "1" for a
marked input and "maybe" otherwise), called over plain HTTP. Texts are picked by asking each stage's own
concrete System One model first, so every expectation is some stage's own answer."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.procs import (
    EngineProc,
    HttpProc,
    free_port_block,
    managed_worker_key,
    start_engine,
    start_frontend,
    start_router,
)

KEY = {"authorization": "Bearer k"}
STAGES = ("fast", "second", "third")
ACCEPT = 0.8  # `native` and `via_remote`: min_probability
STRICT = 0.99  # `strict` and `judged`: no sim stage is that sure of most texts
MARKER = "zebrafish"  # in a text, it makes the judge reply "1" (it sees the input in its prompt: decision/judge.py)
HURRY = "hurry"  # the keyword of `native`'s decision `quick`, whose budget allows one call
REMOTE = "remote-intent"  # the engine-mode router's name for its model: the attached deployment's `model`
READY_S = 300  # three managed sim workers (an engine and a frontend each) on a loaded 2-core host

CONFIG = """
listeners:
  - port: {{port}}
    host: 127.0.0.1
    name: a
    api_keys: [k]
    apis: {{chat: {{}}, models: {{}}, systemone: {{models: [fast, second, third, native, strict, judged, via_remote]}}}}
  - {{port: {other}, host: 127.0.0.1, name: b, apis: {{systemone: {{models: [fast, hidden]}}}}}}
pools:
  judge: {{model: tiny, replicas: [{{url: "{judge}"}}]}}
deployments:
  fast: {{model: tiny-classifier, tasks: [classify], managed: {{backend: sim, engine_args: [--seed, "1"]}}}}
  second: {{model: tiny-classifier, tasks: [classify], managed: {{backend: sim, engine_args: [--seed, "2"]}}}}
  third: {{model: tiny-classifier, tasks: [classify], managed: {{backend: sim, engine_args: [--seed, "3"]}}}}
  remote: {{model: {remote_model}, tasks: [classify], attached: {{urls: ["{remote}"], api: systemone}}}}
entries:
  auto: {{default: [judge]}}
  native:
    api: systemone
    signals: [{{name: hurry, type: keyword, keywords: [{hurry}]}}]
    decisions: [{{name: quick, when: hurry, stages: [fast, second, third], budget: {{max_calls: 1}}}}]
    default: [fast, second, third]
    algorithm: {{accept: {{min_probability: {accept}}}}}
    budget: {{deadline_s: 30, max_calls: 3}}
  strict:
    api: systemone
    default: [fast, second, third]
    algorithm: {{accept: {{min_probability: {strict}}}}}
    budget: {{deadline_s: 30, max_calls: 2}}
  judged:
    api: systemone
    default: [fast, second]
    algorithm: {{accept: {{min_probability: {strict}}}, judge: {{pool: judge, timeout_s: 20}}}}
    budget: {{deadline_s: 30}}
  via_remote:
    api: systemone
    default: [fast, remote]
    algorithm: {{accept: {{min_probability: {accept}}}}}
    budget: {{deadline_s: 30}}
  hidden:
    api: systemone
    default: [fast, second]
    budget: {{deadline_s: 30}}
"""
JUDGE_SCRIPT = [{"match": MARKER, "reply": "1"}, {"match": ".", "reply": "maybe"}]


@dataclass
class Fleet:
    router: HttpProc
    other: str  # listener b's URL
    remote: str  # the engine-mode router's URL

    def ask(self, body: dict[str, Any], url: str | None = None, headers: dict[str, str] | None = None
            ) -> httpx.Response:
        return httpx.post((url or self.router.url) + "/v1/systemone", json=body,
                          headers=KEY if headers is None else headers, timeout=60)

    def answer(self, model: str, texts: list[str]) -> dict[str, Any]:
        r = self.ask({"model": model, "input": texts})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def worker_prompt_tokens(self, deployment: str) -> float:
        """The prompt tokens a managed deployment's worker has counted (its frontend's /metrics): what
        it was asked, seen from the worker's side rather than the router's."""
        ready = httpx.get(self.router.url + "/ready", headers=KEY, timeout=10).json()
        [worker] = ready["deployments"][deployment]["workers"]
        metrics = httpx.get(worker["url"] + "/metrics", timeout=10,
                            headers={"authorization": f"Bearer {managed_worker_key(worker['url'])}"})
        assert metrics.status_code == 200, metrics.text
        found = re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", metrics.text, re.M)
        return sum(float(v) for v in found)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("native")
    procs: list[EngineProc | HttpProc] = []
    try:
        script = tmp / "judge.json"
        script.write_text(json.dumps(JUDGE_SCRIPT))
        engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1",
                              "--sim-script", str(script))
        procs.append(engine)
        judge = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint())
        procs.append(judge)
        # The engine-mode router: its model's worker is seeded 0, unlike every stage of the main router.
        port = free_port_block(1, spread=0)
        log_path = tmp / f"engine-mode-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "services.router", "-e", f"{REMOTE}=tiny-classifier",
                                     "--engine-backend", "sim", "--host", "127.0.0.1", "--port", str(port)],
                                    stdout=log, stderr=subprocess.STDOUT)
        remote = HttpProc(proc, port, log_path)
        procs.append(remote)
        remote.wait_ready(timeout_s=READY_S)
        other = free_port_block(1, spread=0)
        config = CONFIG.format(other=other, judge=judge.url, remote=remote.url, remote_model=REMOTE,
                               hurry=HURRY, accept=ACCEPT, strict=STRICT)
        router = start_router(tmp, config)
        procs.append(router)
        router.wait_ready(KEY, READY_S)
        yield Fleet(router, f"http://127.0.0.1:{other}", remote.url)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait_stopped()


@dataclass
class Probe:
    """Each stage's own answer (its concrete System One row) per candidate text."""

    rows: dict[str, dict[str, dict[str, Any]]]  # deployment -> text -> row

    def top(self, stage: str, text: str) -> float:
        return float(self.rows[stage][text]["probability"])

    def find(self, texts: list[str], *conditions: tuple[str, bool, float]) -> str:
        """The first text whose every (stage, confident?, threshold) holds."""
        return self.find_all(texts, *conditions, n=1)[0]

    def find_all(self, texts: list[str], *conditions: tuple[str, bool, float], n: int) -> list[str]:
        """The first `n` such texts: deterministic, as the sim's answers are functions of the tokens and
        the seed alone."""
        found = [text for text in texts
                 if all((self.top(stage, text) >= threshold) == sure for stage, sure, threshold in conditions)]
        assert len(found) >= n, f"{len(found)} candidate texts meet {conditions}, {n} needed: widen the candidates"
        return found[:n]


CANDIDATES = [f"sample request number {i}" for i in range(60)]
MARKED = [f"{MARKER} sample request number {i}" for i in range(60)]
HURRIED = [f"{HURRY} sample request number {i}" for i in range(60)]


@pytest.fixture(scope="module")
def probe(fleet: Fleet) -> Probe:
    texts = CANDIDATES + MARKED + HURRIED
    rows = {}
    for stage in STAGES:
        answer = fleet.answer(stage, texts)
        assert answer["routing"] is None and answer["deployment"] == stage
        rows[stage] = {text: row for text, row in zip(texts, answer["data"], strict=True)}
    return Probe(rows)


def _own(row: dict[str, Any]) -> dict[str, Any]:
    """What a row says a model answered, without the recipe's own keys (index, stage, judged)."""
    return {k: row[k] for k in ("label", "probability", "probs")}


def test_a_confident_text_is_answered_by_the_fast_stage_alone(fleet: Fleet, probe: Probe) -> None:
    text = probe.find(CANDIDATES, ("fast", True, ACCEPT))
    body = fleet.answer("native", [text])
    assert (body["object"], body["model"], body["family"], body["deployment"]) == \
        ("systemone.classification", "native", "classifier", "fast")
    assert body["routing"] == {"recipe": "native", "decision": "default", "stages_called": ["fast"], "calls": 1,
                               "judge_calls": 0, "deadline_s": 30, "max_calls": 3}
    [row] = body["data"]
    assert (row["index"], row["stage"], row["judged"]) == (0, "fast", False)
    assert _own(row) == _own(probe.rows["fast"][text])


def test_an_unconfident_text_escalates_to_the_second_stage_and_gets_its_own_answer(
        fleet: Fleet, probe: Probe) -> None:
    text = probe.find(CANDIDATES, ("fast", False, ACCEPT), ("second", True, ACCEPT))
    body = fleet.answer("native", [text])
    assert body["routing"]["stages_called"] == ["fast", "second"] and body["routing"]["calls"] == 2
    [row] = body["data"]
    assert row["stage"] == "second" and row["judged"] is False
    assert _own(row) == _own(probe.rows["second"][text]) != _own(probe.rows["fast"][text])
    assert body["deployment"] == "second"


def test_a_mixed_batch_escalates_only_its_unconfident_inputs(fleet: Fleet, probe: Probe) -> None:
    sure = probe.find_all(CANDIDATES, ("fast", True, ACCEPT), n=2)
    unsure = probe.find_all(CANDIDATES, ("fast", False, ACCEPT), ("second", True, ACCEPT), n=2)
    texts = [unsure[0], sure[0], unsure[1], sure[1]]
    body = fleet.answer("native", texts)
    assert body["routing"]["stages_called"] == ["fast", "second"] and body["routing"]["calls"] == 2
    assert [r["stage"] for r in body["data"]] == ["second", "fast", "second", "fast"]
    assert [r["index"] for r in body["data"]] == [0, 1, 2, 3]
    for row, text in zip(body["data"], texts, strict=True):
        assert _own(row) == _own(probe.rows[row["stage"]][text])
    # Stage 2 was sent the two unconfident inputs only: the usage is fast's for all four, second's for two.
    fast_all = fleet.answer("fast", texts)["usage"]["prompt_tokens"]
    second_two = fleet.answer("second", unsure)["usage"]["prompt_tokens"]
    assert body["usage"] == {"prompt_tokens": fast_all + second_two, "total_tokens": fast_all + second_two}
    assert second_two < fleet.answer("second", texts)["usage"]["prompt_tokens"]


def test_the_call_cap_cuts_the_third_stage(fleet: Fleet, probe: Probe) -> None:
    text = probe.find(CANDIDATES, *((stage, False, STRICT) for stage in STAGES))
    before = {stage: fleet.worker_prompt_tokens(stage) for stage in STAGES}
    body = fleet.answer("strict", [text])
    assert body["routing"] == {"recipe": "strict", "decision": "default", "stages_called": ["fast", "second"],
                               "calls": 2, "judge_calls": 0, "deadline_s": 30, "max_calls": 2}
    [row] = body["data"]
    assert row["stage"] == "second" and _own(row) == _own(probe.rows["second"][text])
    # Seen from the workers: the first two counted the text's tokens, the third was never asked.
    after = {stage: fleet.worker_prompt_tokens(stage) for stage in STAGES}
    assert after["fast"] > before["fast"] and after["second"] > before["second"]
    assert after["third"] == before["third"]


def test_a_decisions_budget_tightens_the_entrys(fleet: Fleet, probe: Probe) -> None:
    text = probe.find(HURRIED, ("fast", False, ACCEPT))
    body = fleet.answer("native", [text])
    assert body["routing"] == {"recipe": "native", "decision": "quick", "stages_called": ["fast"], "calls": 1,
                               "judge_calls": 0, "deadline_s": 30, "max_calls": 1}
    [row] = body["data"]
    assert row["stage"] == "fast" and _own(row) == _own(probe.rows["fast"][text])
    # Without the keyword the same recipe escalates past the fast stage (max_calls 3, the entry's).
    plain = probe.find(CANDIDATES, ("fast", False, ACCEPT))
    assert len(fleet.answer("native", [plain])["routing"]["stages_called"]) > 1


def test_the_judge_chooses_the_first_stage_for_a_marked_text_and_abstains_otherwise(
        fleet: Fleet, probe: Probe) -> None:
    unsure = (("fast", False, STRICT), ("second", False, STRICT))
    marked = probe.find(MARKED, *unsure)
    plain = probe.find(CANDIDATES, *unsure)
    body = fleet.answer("judged", [marked, plain])
    assert body["routing"]["stages_called"] == ["fast", "second"]
    assert (body["routing"]["calls"], body["routing"]["judge_calls"]) == (2, 2)  # the judge is no stage call
    chose, abstained = body["data"]
    assert (chose["stage"], chose["judged"]) == ("fast", True)
    assert _own(chose) == _own(probe.rows["fast"][marked]) != _own(probe.rows["second"][marked])
    assert (abstained["stage"], abstained["judged"]) == ("second", False)
    assert _own(abstained) == _own(probe.rows["second"][plain])
    assert body["deployment"] == "fast"  # the first row's stage


def test_an_engine_mode_router_is_a_stage_that_answers_its_own_output(fleet: Fleet, probe: Probe) -> None:
    text = probe.find(CANDIDATES, ("fast", False, ACCEPT))
    body = fleet.answer("via_remote", [text])
    assert body["routing"]["stages_called"] == ["fast", "remote"] and body["routing"]["calls"] == 2
    [row] = body["data"]
    own = fleet.ask({"model": REMOTE, "input": [text]}, url=fleet.remote, headers={})
    assert own.status_code == 200, own.text
    [remote_row] = own.json()["data"]
    assert row["stage"] == "remote" and _own(row) == _own(remote_row) != _own(probe.rows["fast"][text])


def test_a_native_recipe_is_served_only_where_published_and_under_the_listeners_keys(fleet: Fleet) -> None:
    body = {"model": "native", "input": ["x"]}
    assert fleet.ask(body).status_code == 200
    assert fleet.ask(body, headers={}).status_code == 401
    assert fleet.ask(body, headers={"authorization": "Bearer wrong"}).status_code == 401
    # `hidden` exists (listener b serves it) but a does not publish it: the 404 of a name nothing declares.
    assert fleet.ask({"model": "hidden", "input": ["x"]}, url=fleet.other, headers={}).status_code == 200
    unpublished = fleet.ask({"model": "hidden", "input": ["x"]})
    unknown = fleet.ask({"model": "nothing", "input": ["x"]})
    assert unpublished.status_code == unknown.status_code == 404
    assert unpublished.json() == json.loads(unknown.text.replace("nothing", "hidden"))
    # Listener b publishes other models: `native` is unknown there.
    elsewhere = fleet.ask(body, url=fleet.other, headers={})
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["param"] == "model", elsewhere.text


def test_the_models_list_says_which_names_route(fleet: Fleet) -> None:
    listed = httpx.get(fleet.router.url + "/v1/systemone/models", headers=KEY, timeout=10)
    assert listed.status_code == 200, listed.text
    assert [(m["id"], m["family"], m["routing"]) for m in listed.json()["data"]] == [
        ("fast", "classifier", False), ("second", "classifier", False), ("third", "classifier", False),
        ("native", "classifier", True), ("strict", "classifier", True), ("judged", "classifier", True),
        ("via_remote", "classifier", True)]
    other = httpx.get(fleet.other + "/v1/systemone/models", timeout=10).json()["data"]
    assert [(m["id"], m["routing"]) for m in other] == [("fast", False), ("hidden", True)]


def test_a_native_recipe_is_no_chat_model(fleet: Fleet) -> None:
    chat = httpx.post(fleet.router.url + "/v1/chat/completions", headers=KEY, timeout=30,
                      json={"model": "native", "messages": [{"role": "user", "content": "hello"}]})
    assert chat.status_code == 404 and chat.json()["error"]["param"] == "model", chat.text
    models = httpx.get(fleet.router.url + "/v1/models", headers=KEY, timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["auto"]
