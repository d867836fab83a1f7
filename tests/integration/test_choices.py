"""Several choices per request, end to end with the official openai SDK: `n > 1` on chat and completions
and batched completion prompts, over a frontend with two headless sim ranks. Each choice is an engine
request of its own; a seeded request's choice j samples with seed + j, so it equals a one-choice request
with that seed (the sim's tokens are a function of prompt and seed), which is what these tests compare
against. Streamed choices interleave; usage counts each prompt once and sums the completions; a
prompt's choices share one rank, whose prefix cache the later ones hit."""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import SIM
from tests.support.procs import FrontendProc, start_engine, start_frontend

CHAT = [{"role": "user", "content": "Say several things"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    tmp = tmp_path_factory.mktemp("choices")
    engine = start_engine(tmp, *SIM, "--sim-decode-ms", "2", ranks=2)
    try:
        fe = start_frontend(tmp, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                            "--engine-addresses", f"{engine.endpoint(0)},{engine.endpoint(1)}",
                            "--max-request-choices", "8")
        try:
            yield fe
        finally:
            fe.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def client(fleet: FrontendProc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def _chat_text(client: openai.OpenAI, seed: int, **kwargs: object) -> str:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=seed, **kwargs)  # type: ignore[call-overload]
    return r.choices[0].message.content  # type: ignore[no-any-return]


def test_chat_n_gives_n_indexed_choices_each_seeded_as_vllm(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=40, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert texts == [_chat_text(client, 40 + j) for j in range(3)]
    assert len(set(texts)) == 3
    single = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=40)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    assert r.usage.completion_tokens == 3 * 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 36
    assert all(c.finish_reason == "length" for c in r.choices)


def test_chat_n_streamed_interleaves_and_matches_the_whole_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=7, n=3)
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=7, n=3,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    texts: dict[int, str] = defaultdict(str)
    roles: list[int] = []
    finishes: dict[int, str] = {}
    order: list[int] = []
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        assert choice.index not in finishes, "a choice's chunk after its finish"
        if choice.delta.role is not None:
            roles.append(choice.index)
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finishes[choice.index] = choice.finish_reason
        order.append(choice.index)
    assert roles == [0, 1, 2]  # each choice's role first, as vLLM sends them
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    # Interleaved: the choices' chunks come as their tokens do, not one choice after another.
    assert order != sorted(order)
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 36 and usage.usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_n_with_logprobs_gives_each_choice_its_own(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, seed=1, n=2, logprobs=True,
                                       top_logprobs=2)
    for c in r.choices:
        assert "".join(e.token for e in c.logprobs.content) == c.message.content
        assert len(c.logprobs.content) == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, seed=1, n=2,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed[choice.index] += [e.token for e in choice.logprobs.content]
    assert [streamed[i] for i in range(2)] == [[e.token for e in c.logprobs.content] for c in r.choices]


def _text(client: openai.OpenAI, prompt: str | list[int], seed: int, **kwargs: object) -> str:
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, seed=seed, **kwargs)  # type: ignore[arg-type]
    return r.choices[0].text


def test_a_batch_of_prompts_times_n_is_indexed_as_vllm(client: openai.OpenAI) -> None:
    prompts: list[str | list[int]] = ["The first prompt", [9707, 11, 1879]]
    r = client.completions.create(model="tiny", prompt=prompts, max_tokens=5, seed=3, n=2, echo=True)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    expected = [_text(client, p, 3 + j, echo=True) for p in prompts for j in range(2)]
    assert [c.text for c in r.choices] == expected
    assert r.choices[0].text.startswith("The first prompt") and r.choices[1].text.startswith("The first prompt")
    alone = [client.completions.create(model="tiny", prompt=p, max_tokens=1).usage.prompt_tokens  # type: ignore[arg-type]
             for p in prompts]
    assert r.usage.prompt_tokens == sum(alone)  # each prompt once
    assert r.usage.completion_tokens == 4 * 5


def test_a_batch_streamed_carries_every_choice(client: openai.OpenAI) -> None:
    prompts = ["one prompt", "another prompt", "a third prompt"]
    chunks = list(client.completions.create(model="tiny", prompt=prompts, max_tokens=5, seed=9, stream=True,
                                            stream_options={"include_usage": True}))
    texts: dict[int, str] = defaultdict(str)
    finishes = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == [_text(client, p, 9) for p in prompts]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 15


def _engine_metric(fleet: FrontendProc, name: str) -> dict[str, float]:
    text = httpx.get(fleet.url + "/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(rf'^{name}{{.*engine="(\d+)".*}} (\S+)$', text, re.M)}


def test_a_prompts_choices_share_its_rank_and_hit_its_prefix_cache(client: openai.OpenAI,
                                                                    fleet: FrontendProc) -> None:
    prompt = "a long prompt that fills several KV blocks " * 20
    before = _engine_metric(fleet, "vllm:prefix_cache_hits_total")
    r = client.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=2, seed=5, n=4)
    rank = r.headers["x-data-parallel-rank"]
    prompt_tokens = r.parse().usage.prompt_tokens
    # Stats reach the frontend with each heartbeat: wait for the hits to show.
    for _ in range(100):
        after = _engine_metric(fleet, "vllm:prefix_cache_hits_total")
        hits = {k: after[k] - before.get(k, 0.0) for k in after}
        if hits.get(rank, 0) >= 3 * (prompt_tokens - 16):
            break
        httpx.get(fleet.url + "/health")
    # The three later choices found all but the last (partial) block of the prompt cached.
    assert hits[rank] >= 3 * (prompt_tokens - 16), hits
    assert sum(v for k, v in hits.items() if k != rank) == 0, hits


def test_too_many_choices_and_best_of_are_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, n=9)
    assert info.value.body["param"] == "n" and "--max-request-choices" in info.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=["a", "b", "c"], max_tokens=2, n=3)
    assert info.value.body["param"] == "prompt" and "9 choices" in info.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="a", max_tokens=2, n=2, best_of=2)
    assert info.value.body["param"] == "best_of"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="a", max_tokens=2, n=2, best_of=1)
    assert info.value.body["param"] == "best_of"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=["a", ""], max_tokens=2)
    assert info.value.body["param"] == "prompt[1]"  # type: ignore[index]


def test_a_client_that_leaves_aborts_every_choice(fleet: FrontendProc, tmp_path: Path) -> None:
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 2000, "n": 3, "stream": True, "seed": 1}
    with httpx.stream("POST", fleet.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            break
    for _ in range(200):
        open_streams = _engine_metric(fleet, "fleet:engine_streams_open")
        if sum(open_streams.values()) == 0:
            break
        httpx.get(fleet.url + "/health")
    assert sum(open_streams.values()) == 0, open_streams
