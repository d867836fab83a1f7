"""The chat escalate's judge through real processes: a router whose escalate entry has two stages, each a
chat pool of a frontend over a sim engine with a scripted reply that the acceptance regex never
matches, and a judge pool whose sim engine is scripted to reply "1" (it chooses the first stage's
answer) or, for a question marked so, "maybe" (garbled: it abstains). Clients use the official openai SDK.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.procs import EngineProc, FrontendProc, HttpProc, start_engine, start_frontend, start_router

FAST, STRONG = "The fast stage says 4.", "The strong stage says 5."
MAYBE = "(ask the judge for a maybe)"
# The judge's prompt holds the client's question and the options: a question marked MAYBE gets "maybe".
JUDGE_SCRIPT = [{"match": "ask the judge for a maybe", "reply": "maybe"}, {"match": "Option 2", "reply": "1"}]

CONFIG = """
listeners: [{{port: {port}, host: 127.0.0.1}}]
pools:
  fast: {{model: tiny, replicas: [{{url: "{fast}"}}]}}
  strong: {{model: tiny, replicas: [{{url: "{strong}"}}]}}
  judge: {{model: tiny, replicas: [{{url: "{judge}"}}]}}
entries:
  auto:
    default: [fast]
    algorithm:
      type: escalate
      stages: [fast, strong]
      accept: {{regex: "no stage ever writes this"}}
      deadline_s: 60
      judge: {{pool: judge, timeout_s: 30}}
"""


def _pool(tmp: Path, name: str, script: list[dict[str, str]]) -> tuple[EngineProc, FrontendProc]:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(script))
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1", "--sim-script", str(path))
    try:
        return engine, start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint())
    except BaseException:
        engine.stop()
        raise


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("judge")
    procs: list[EngineProc | HttpProc] = []
    try:
        urls = {}
        for name, script in (("fast", [{"match": ".", "reply": FAST}]), ("strong", [{"match": ".", "reply": STRONG}]),
                             ("judge", JUDGE_SCRIPT)):
            engine, frontend = _pool(tmp, name, script)
            procs += [engine, frontend]
            urls[name] = frontend.url
        router = start_router(tmp, CONFIG.format(port="{port}", **urls))
        procs.append(router)
        with openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
            yield c
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait_stopped()


def _ask(client: openai.OpenAI, question: str) -> tuple[str, dict[str, str], dict[str, object]]:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": question}])
    completion = raw.parse()
    headers = {k: v for k, v in raw.headers.items() if k.startswith("x-router-")}
    return completion.choices[0].message.content or "", headers, (completion.model_extra or {}).get("router", {})


def test_the_judge_chooses_the_first_stages_answer(client: openai.OpenAI) -> None:
    text, headers, router = _ask(client, "What is 2 + 2?")
    assert text == FAST
    assert headers["x-router-judge"] == "chose" and headers["x-router-stage"] == "fast"
    assert headers["x-router-pool"] == "fast" and headers["x-router-accepted"] == "false"
    assert headers["x-router-calls"] == "2"  # both stages ran: the judge is no stage call
    assert router == {"stage": "fast", "calls": 2, "accepted": False,
                      "reason": "no match for 'no stage ever writes this'", "judge": "chose"}


def test_a_judge_that_replies_anything_but_an_option_abstains(client: openai.OpenAI) -> None:
    text, headers, router = _ask(client, f"What is 2 + 3? {MAYBE}")
    assert text == STRONG
    assert headers["x-router-judge"] == "abstained" and headers["x-router-stage"] == "strong"
    assert headers["x-router-pool"] == "strong" and router["judge"] == "abstained"


def test_a_streaming_client_gets_the_judges_choice_replayed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "2 + 2?"}],
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == FAST
