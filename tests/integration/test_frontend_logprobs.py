"""Logprobs end to end with the official openai SDK: a frontend process over a headless sim engine, whose
logprobs are a fixed fake distribution (backends/sim/fake_logprobs.py) and whose scripted reply to "capital
of France" ends with EOS. Shapes as OpenAI's and vLLM's, values consistent with the returned tokens
(their strings join to the text), streamed and not; echo; prompt_logprobs; a stop string; the EOS."""
from __future__ import annotations

import json
import math
from collections.abc import Iterator

import openai
import pytest

from tests.support.procs import openai_over_sim

CHAT = [{"role": "user", "content": "Tell me about logprobs"}]
LN2 = math.log(2)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("logprobs")
    script = tmp / "script.json"
    script.write_text(json.dumps([{"match": "capital of France", "reply": "Paris."}]))
    with openai_over_sim(tmp, ["--sim-decode-ms", "1", "--sim-script", str(script)]) as c:
        yield c


def _check_entry(entry: object, k: int) -> None:
    token, lp, raw, tops = entry.token, entry.logprob, entry.bytes, entry.top_logprobs  # type: ignore[attr-defined]
    assert raw == list(token.encode())
    assert len(tops) == k and [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
    assert all(t.bytes == list(t.token.encode()) for t in tops)
    rank = round(-lp / LN2)  # the sim's distribution: rank r has logprob -r ln 2
    assert math.isclose(lp, -rank * LN2, rel_tol=1e-6)
    if rank <= k:  # the token is among the k most likely, at its rank
        assert (tops[rank - 1].token, tops[rank - 1].logprob) == (token, lp)


def test_chat_logprobs_match_the_returned_tokens_streamed_and_not(client: openai.OpenAI) -> None:
    kwargs = {"model": "tiny", "messages": CHAT, "max_tokens": 24, "seed": 3, "logprobs": True, "top_logprobs": 5}
    r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 24
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for entry in content:
        _check_entry(entry, 5)
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]  # type: ignore[call-overload]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    for c in chunks:  # each chunk's tokens are the ones that made its text
        if c.choices[0].delta.content:
            assert "".join(e.token for e in c.choices[0].logprobs.content) == c.choices[0].delta.content


def test_chat_top_logprobs_zero_and_token_ids(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, logprobs=True, seed=1,
                                       extra_body={"return_tokens_as_token_ids": True})
    content = r.choices[0].logprobs.content
    assert [e.top_logprobs for e in content] == [[], [], [], []]
    assert all(e.token.startswith("token_id:") and int(e.token[9:]) >= 0 for e in content)
    plain = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, seed=1)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_are_openais_columns(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=16, logprobs=3, seed=5)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 16
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(16)]
    for token, logprob, tops in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(tops)) == token and tops[token] == logprob and 3 <= len(tops) <= 4
    streamed = [c.choices[0] for c in client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=16, logprobs=3, seed=5, stream=True) if c.choices]
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == lp.tokens
    assert [o for c in streamed if c.logprobs for o in c.logprobs.text_offset] == lp.text_offset


def test_echo_returns_the_prompt_and_its_logprobs_first(client: openai.OpenAI) -> None:
    prompt = "The quick brown fox"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, logprobs=2, echo=True, seed=2)
    choice = r.choices[0]
    n = r.usage.prompt_tokens
    assert choice.text.startswith(prompt) and "".join(choice.logprobs.tokens) == choice.text
    assert len(choice.logprobs.tokens) == n + 5 and "".join(choice.logprobs.tokens[:n]) == prompt
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert all(x is not None for x in choice.logprobs.token_logprobs[1:])
    prompt_logprobs = choice.model_extra["prompt_logprobs"]  # vLLM's field, as the engine sent them
    assert len(prompt_logprobs) == n and prompt_logprobs[0] is None
    streamed = [c.choices[0] for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, logprobs=2, echo=True, seed=2, stream=True) if c.choices]
    assert "".join(c.text for c in streamed) == choice.text
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == choice.logprobs.tokens
    no_logprobs = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, echo=True, seed=2)
    assert no_logprobs.choices[0].text == choice.text and no_logprobs.choices[0].logprobs is None


def test_prompt_logprobs_are_vllms_field(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=1, extra_body={"prompt_logprobs": 2})
    prompt = r.model_extra["prompt_logprobs"]
    assert len(prompt) == r.usage.prompt_tokens and prompt[0] is None
    for position in prompt[1:]:
        (own, first), *alternatives = position.items()
        assert int(own) >= 0 and set(first) == {"logprob", "rank", "decoded_token"}
        assert len(alternatives) in (1, 2) and all(v["rank"] in (1, 2) for _, v in alternatives)
    with pytest.raises(openai.BadRequestError, match="not available when `stream=True`"):
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=1, stream=True,
                                       extra_body={"prompt_logprobs": 2})


def test_a_stop_string_cuts_the_text_not_the_tokens(client: openai.OpenAI) -> None:
    """As vLLM: every generated token keeps its entry, the one completing the stop string too."""
    kwargs = {"model": "tiny", "prompt": "Count with me", "max_tokens": 12, "logprobs": 0, "seed": 9}
    full = client.completions.create(**kwargs)  # type: ignore[call-overload]
    tokens = full.choices[0].logprobs.tokens
    i = next(i for i in range(2, 12) if tokens[i].strip() and tokens[i].strip() not in "".join(tokens[:i]))
    stop = tokens[i].strip()
    r = client.completions.create(stop=[stop], **kwargs)  # type: ignore[call-overload]
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].text.endswith(stop)
    assert r.choices[0].logprobs.tokens == tokens[:i + 1] and r.usage.completion_tokens == i + 1
    assert "".join(tokens[:i + 1]).startswith(r.choices[0].text)


def test_the_eos_that_ended_a_reply_has_its_entry_but_no_text(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="tiny", messages=ask, max_tokens=10, logprobs=True)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("Paris.", "stop")
    assert [e.token for e in r.choices[0].logprobs.content] == ["Paris", ".", "<|im_end|>"]
    chunks = [c.choices[0] for c in client.chat.completions.create(model="tiny", messages=ask, max_tokens=10,
                                                                   logprobs=True, stream=True) if c.choices]
    assert chunks[-1].finish_reason == "stop" and [e.token for e in chunks[-1].logprobs.content] == ["<|im_end|>"]
