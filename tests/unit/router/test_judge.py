"""The LLM judge (services/router/decision/judge.py): its prompt and the strict reading of its reply;
asked over a chat pool (services/router/listeners/judge_caller.py) and by the chat escalate
(services/router/listeners/escalate.py), in process through the router's ASGI app against a fake of
the Upstream port."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import EscalateAlgorithm, JudgeConfig, RouterConfig, parse_config
from services.router.decision.engine import Router
from services.router.decision.judge import chat_option, cut, option, prompt, read
from services.router.listeners.judge_caller import MAX_TOKENS, JudgeError
from services.router.metrics import RouterMetrics
from services.router.runtime.models import Label
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply, completion

# ---- the prompt and the reading of the reply ----


def test_the_prompt_offers_numbered_options_and_says_how_to_answer() -> None:
    messages = prompt("classifier", "is this spam?", [("fast", "label spam (probability 0.510)"),
                                                      ("strong", "label ham (probability 0.550)")])
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    assert "exactly one of 1 to 2" in system and "abstain" in system and "classification" in system
    assert "Input:\nis this spam?" in user
    assert "Option 1 (from fast):\nlabel spam (probability 0.510)" in user
    assert "Option 2 (from strong):\nlabel ham (probability 0.550)" in user
    assert "exactly 1 (" in prompt("chat", "hi", [("only", "hello")])[0]["content"]


def test_an_option_shows_the_labels_or_the_best_document_and_scores() -> None:
    label = Label("spam", 0.51, {"ham": 0.39, "spam": 0.51, "other": 0.1})
    assert option(label) == "label spam (probability 0.510); others: ham 0.390, other 0.100"
    assert option(Label("x", 1.0, {"x": 1.0})) == "label x (probability 1.000)"
    assert option((0.2, 0.8, 0.5), ["d1", "d2", "d3"]) == \
        "best document #2 (score 0.800): d2; others by score: #3 0.500, #1 0.200"
    assert option(()) == "no scores"


def test_long_texts_are_cut_at_the_end_that_matters() -> None:
    assert chat_option("x" * 5000).endswith(" [...]") and len(chat_option("x" * 5000)) == 2006
    assert cut("abcdef", 3) == "abc [...]" and cut("abcdef", 3, tail=True) == "[...] def" and cut("ab", 3) == "ab"


@pytest.mark.parametrize(("reply", "chosen"), [
    ("1", 0), ("3", 2), (" 2\n", 1), ('{"choice": 2}', 1), ('{"choice": "abstain"}', None),
    ("abstain", None), ("Abstain\n", None), ("ABSTAIN", None),
])
def test_a_reply_in_the_form_asked_is_read(reply: str, chosen: int | None) -> None:
    assert read(reply, 3) == chosen


@pytest.mark.parametrize("reply", [
    "1.", "Option 1", "1 because it is right", "I choose 2", "1 2", "1, 2", "0", "4", "-1", "+1", "", "maybe",
    "one", "²", '{"choice": 4}', '{"choice": "2"}', '{"choice": true}', '{"choice": 1, "why": "x"}',
    '{"choice": 1', "[1]", "<think>hmm</think>1", "abstain.",
])
def test_a_garbled_reply_abstains(reply: str) -> None:
    assert read(reply, 3) is None


# ---- the chat escalate's judge, through the router app ----

X, Y, J = "http://cheap:8000", "http://strong:8000", "http://judge:8000"
HI = [{"role": "user", "content": "which one?"}]
CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080}],
    "pools": {"cheap": {"model": "cheap-m", "replicas": [{"url": X}]},
              "strong": {"model": "strong-m", "replicas": [{"url": Y}]},
              "judge": {"model": "judge-m", "replicas": [{"url": J}]}},
    "entries": {name: {"default": ["cheap"], "algorithm": {"type": "escalate", "stages": ["cheap", "strong"],
                                                           "accept": {"regex": "ok"}, **extra}}
                for name, extra in (("judged", {}), ("plain", {}), ("quick", {"deadline_s": 0.2}))},
}


def _config(timeout_s: float = 10.0) -> RouterConfig:
    """CONFIG with a judge on `judged` and `quick` (written in code until the config reader reads it)."""
    config = parse_config(CONFIG)
    entries = dict(config.entries)
    for name in ("judged", "quick"):
        algorithm = entries[name].algorithm
        assert isinstance(algorithm, EscalateAlgorithm)
        entries[name] = replace(entries[name], algorithm=replace(algorithm, judge=JudgeConfig("judge", timeout_s)))
    return replace(config, entries=entries)


class Fleet:
    def __init__(self, timeout_s: float = 10.0) -> None:
        self.router = Router(_config(timeout_s))
        self.pools = build_pools(self.router.config)
        self.upstream = FakeUpstream()
        self.metrics = RouterMetrics(self.pools)
        self.app = RouterApp(self.router.config, self.router, self.pools, self.upstream, self.metrics)

    def chat(self, model: str = "judged", **extra: Any) -> Answer:
        body = {"model": model, "messages": HI, **extra}
        return asyncio.run(request(self.app, "POST", "/v1/chat/completions", body))

    def judge_sent(self) -> list[dict[str, Any]]:
        return [s.body for s in self.upstream.sent if s.url == J]

    def replica(self, pool: str) -> dict[str, Any]:
        [state] = self.pools[pool].snapshot()
        return state


def _reply(text: str) -> Reply:
    return Reply(chunks=(completion(text),))


def _stages_unaccepted(fleet: Fleet) -> None:
    fleet.upstream.answer(X, _reply("first answer"))
    fleet.upstream.answer(Y, _reply("second answer"))


def _router_headers(r: Answer) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k in ("x-router-judge", "x-router-stage", "x-router-pool",
                                                          "x-router-replica", "x-router-accepted")}


def test_the_judge_picks_an_earlier_stages_answer_which_the_client_gets() -> None:
    fleet = Fleet()
    _stages_unaccepted(fleet)
    fleet.upstream.answer(J, _reply("1"))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "first answer"
    assert _router_headers(r) == {"x-router-judge": "chose", "x-router-stage": "cheap", "x-router-pool": "cheap",
                                  "x-router-replica": X, "x-router-accepted": "false"}
    assert r.json()["router"] == {"stage": "cheap", "calls": 2, "accepted": False, "reason": "no match for 'ok'",
                                  "judge": "chose"}
    [asked] = fleet.judge_sent()
    assert asked["model"] == "judge-m" and asked["temperature"] == 0 and asked["max_tokens"] == MAX_TOKENS
    assert "stream" not in asked
    user = asked["messages"][1]["content"]
    assert "which one?" in user and "Option 1 (from cheap):\nfirst answer" in user
    assert "Option 2 (from strong):\nsecond answer" in user
    assert fleet.replica("judge")["inflight"] == 0


@pytest.mark.parametrize("reply", ["maybe", "abstain", "1 or 2", "3"])
def test_a_judge_that_abstains_or_garbles_leaves_the_last_answer(reply: str) -> None:
    fleet = Fleet()
    _stages_unaccepted(fleet)
    fleet.upstream.answer(J, _reply(reply))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "second answer"
    assert _router_headers(r) == {"x-router-judge": "abstained", "x-router-stage": "strong",
                                  "x-router-pool": "strong", "x-router-replica": Y, "x-router-accepted": "false"}
    assert r.json()["router"]["judge"] == "abstained"


def test_a_failing_judge_abstains_and_its_replica_is_blamed() -> None:
    fleet = Fleet()
    _stages_unaccepted(fleet)
    fleet.upstream.answer(J, Reply(refuse="HTTP 500: boom", retryable=False))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "second answer"
    assert r.headers["x-router-judge"] == "abstained"
    assert fleet.replica("judge")["consecutive_failures"] == 1


def test_a_judge_that_answers_past_the_deadline_abstains_and_no_replica_is_blamed() -> None:
    fleet = Fleet()
    _stages_unaccepted(fleet)
    fleet.upstream.answer(J, Reply(hang=True))
    r = fleet.chat("quick")  # a 0.2 s deadline: the stages answer at once, the judge never
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "second answer"
    assert r.headers["x-router-judge"] == "abstained"
    assert fleet.replica("judge")["consecutive_failures"] == 0 and fleet.replica("judge")["inflight"] == 0


def test_the_judges_own_timeout_bounds_it_within_a_longer_deadline() -> None:
    fleet = Fleet(timeout_s=0.05)
    _stages_unaccepted(fleet)
    fleet.upstream.answer(J, Reply(hang=True))
    r = fleet.chat()  # a 30 s deadline: only the judge's 0.05 s timeout can end the wait
    assert r.status == 200 and r.headers["x-router-judge"] == "abstained"


def test_no_judge_is_asked_when_a_stage_is_accepted_or_the_algorithm_has_none() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("no"))
    fleet.upstream.answer(Y, _reply("ok then"))
    r = fleet.chat()
    assert r.status == 200 and r.headers["x-router-stage"] == "strong" and "x-router-judge" not in r.headers
    assert "judge" not in r.json()["router"]
    _stages_unaccepted(fleet)
    r = fleet.chat("plain")
    assert r.status == 200 and r.headers["x-router-stage"] == "strong" and "x-router-judge" not in r.headers
    assert fleet.judge_sent() == []


def test_a_judge_sees_only_complete_answers() -> None:
    fleet = Fleet()
    refusal = json.dumps({"error": {"message": "bad request", "code": 400}}).encode()
    fleet.upstream.answer(X, Reply(status=400, chunks=(refusal,)))
    fleet.upstream.answer(Y, _reply("second answer"))
    fleet.upstream.answer(J, _reply("2"))  # out of range: one option was offered
    r = fleet.chat()
    assert r.status == 200 and r.headers["x-router-judge"] == "abstained"
    [asked] = fleet.judge_sent()
    user = asked["messages"][1]["content"]
    assert "Option 1 (from strong):\nsecond answer" in user and "Option 2" not in user


def test_the_judge_caller_raises_for_a_refusal_and_reads_the_reply() -> None:
    fleet = Fleet()
    judge = fleet.app.judge
    fleet.upstream.answer(J, _reply("  2 "))
    assert asyncio.run(judge.ask("judge", [{"role": "user", "content": "q"}], timeout_s=1)) == "  2 "
    fleet.upstream.answer(J, Reply(status=400, chunks=(b'{"error": {"message": "no"}}',)))
    with pytest.raises(JudgeError, match="judge pool 'judge' answered HTTP 400"):
        asyncio.run(judge.ask("judge", [{"role": "user", "content": "q"}], timeout_s=1))
    fleet.upstream.answer(J, Reply(hang=True))
    with pytest.raises(TimeoutError):
        asyncio.run(judge.ask("judge", [{"role": "user", "content": "q"}], timeout_s=0.01))
