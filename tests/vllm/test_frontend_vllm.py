"""End to end on the real vLLM backend: a managed frontend (it starts its own headless vllm engine)
answering the official openai SDK, streamed and not; its logprobs against vLLM's own offline LLM."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.procs import FrontendProc, free_port_block, start_frontend

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    pytest.importorskip("vllm")
    engine_port = free_port_block(1)
    fe = start_frontend(tmp_path_factory.mktemp("vllm-fe"), "--backend", "vllm", "--data-parallel-size-local", "1",
                        "--engine-port", str(engine_port), "--engine-arg=--max-model-len=1024",
                        f"--engine-arg=--kv-cache-bytes={16 * 2**20}")
    yield fe
    assert fe.stop() == 0, fe.log()


def test_chat_and_completion_through_vllm(frontend: FrontendProc) -> None:
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                          max_tokens=24, temperature=0)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 24  # type: ignore[union-attr]
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                              max_tokens=24, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same tokens both ways
    done = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8  # type: ignore[union-attr]
    client.close()


TOOLS: list = [  # type: ignore[type-arg]
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_gives_calls_that_match_the_tools_schemas(frontend: FrontendProc, stream: bool) -> None:
    """Random weights write no calls on their own: only vLLM's structured output makes these valid."""
    from jsonschema import validate

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "weather and time?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        # One call at most: random weights would add array items until max_tokens cut them.
        kwargs = {"model": "tiny", "messages": ask, "tools": TOOLS, "tool_choice": choice, "max_tokens": 200,
                  "temperature": 0, "parallel_tool_calls": False}
        if stream:
            calls: dict[int, dict[str, str]] = {}
            for chunk in client.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
                for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
                    entry["name"] += (c.function.name or "") if c.function else ""
                    entry["arguments"] += (c.function.arguments or "") if c.function else ""
            got = [(v["name"], v["arguments"]) for _, v in sorted(calls.items())]
        else:
            r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
            assert r.choices[0].finish_reason == "stop"
            got = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
        assert got, choice
        if isinstance(choice, dict):
            assert [name for name, _ in got] == ["get_time"]
        for name, arguments in got:
            validate(json.loads(arguments), schemas[name])
    client.close()


def test_required_streams_the_calls_it_answers_whole(frontend: FrontendProc) -> None:
    """Greedy, so the same tokens both ways: the streamed pieces join to the whole answer's calls,
    the first piece of each call carrying its id and name, and arrive in more than one delta."""
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS,
              "tool_choice": "required", "max_tokens": 200, "temperature": 0, "parallel_tool_calls": False}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    expected = [(c.id, c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    pieces: list[tuple[int, str | None, str | None, str]] = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
        for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            pieces.append((c.index, c.id, c.function.name if c.function else None,
                           (c.function.arguments or "") if c.function else ""))
    client.close()
    assert len(expected) == 1 and len(pieces) > 1
    index, call_id, name, _ = pieces[0]
    assert index == 0 and call_id and name == expected[0][1]
    assert all(p[0] == 0 and p[1] is None and p[2] is None for p in pieces[1:])
    assert "".join(p[3] for p in pieces) == expected[0][2]
    json.loads(expected[0][2])


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) < 1e-4


def test_logprobs_equal_vllm_offline_generate(frontend: FrontendProc, llm: Any) -> None:
    """The same greedy requests through our HTTP API and through vLLM's LLM.generate: tokens, their
    strings (vLLM's decoded_token), the sampled logprobs and the top-5 alternatives to 1e-4, and
    vLLM's prompt_logprobs field; chat streamed, completions not."""
    from vllm import SamplingParams

    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=5, prompt_logprobs=5)

    # Completions with a token prompt: vLLM's columns, each top dict the token and its 5 alternatives.
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    ref = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    out = ref.outputs[0]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=5,
                                  extra_body={"prompt_logprobs": 5})
    lp = r.choices[0].logprobs
    assert r.choices[0].text == out.text
    assert lp.tokens == [step[t].decoded_token for step, t in zip(out.logprobs, out.token_ids, strict=True)]
    for got, got_tops, step, t in zip(lp.token_logprobs, lp.top_logprobs, out.logprobs, out.token_ids, strict=True):
        assert _close(got, step[t].logprob)
        want = {p.decoded_token: p.logprob for p in step.values()}  # the token first, then by rank
        assert list(got_tops) == list(want) and all(_close(got_tops[s], v) for s, v in want.items())
    prompt_logprobs = r.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ref.prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for got_pos, want_pos in zip(prompt_logprobs[1:], ref.prompt_logprobs[1:], strict=True):
        assert [int(t) for t in got_pos] == list(want_pos)
        for t, cell in got_pos.items():
            want = want_pos[int(t)]
            assert (cell["rank"], cell["decoded_token"]) == (want.rank, want.decoded_token)
            assert _close(cell["logprob"], want.logprob)

    # Chat, streamed: the same prompt as our template renders it; top_logprobs in rank order.
    messages = [{"role": "user", "content": "你好, who are you?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_prompt = tokenizer.encode(text, add_special_tokens=False)
    ref = llm.generate([{"prompt_token_ids": chat_prompt}], params, use_tqdm=False)[0].outputs[0]
    entries = [e for c in client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                       logprobs=True, top_logprobs=5, stream=True)
               if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == len(ref.token_ids)
    for entry, step, t in zip(entries, ref.logprobs, ref.token_ids, strict=True):
        assert entry.token == step[t].decoded_token and _close(entry.logprob, step[t].logprob)
        assert entry.bytes == list(step[t].decoded_token.encode())
        ranked = sorted((p for p in step.values() if p.rank <= 5), key=lambda p: p.rank)
        assert [a.token for a in entry.top_logprobs] == [p.decoded_token for p in ranked]
        assert all(_close(a.logprob, p.logprob) for a, p in zip(entry.top_logprobs, ranked, strict=True))
    client.close()
