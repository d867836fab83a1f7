"""The preprocessing split end to end, real processes over a headless sim engine: /tokenize and
/detokenize round trips against what the chat route counts, render -> /inference/v1/generate giving
the tokens the chat and completions routes give at temperature 0 (the sim's tokens are a function of
the prompt, so equal prompts give equal tokens), a render-only frontend with no engine feeding a
frontend with engines (a gateway's path), Anthropic's count_tokens through a router in front (the
anthropic SDK), and bad input a 400 naming the field."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.procs import EngineProc, FrontendProc, HttpProc, start_engine, start_frontend, start_router

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me about tokens."}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProc, FrontendProc]]:
    tmp = tmp_path_factory.mktemp("preprocess")
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-instant")
    try:
        fe = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint())
        yield engine, fe
        fe.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def url(fleet: tuple[EngineProc, FrontendProc]) -> str:
    return fleet[1].url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def sse(response: httpx.Response) -> list[Any]:
    return [line[6:] if line == "data: [DONE]" else httpx.Response(200, content=line[6:]).json()
            for line in response.text.split("\n") if line.startswith("data: ")]


def test_tokenize_round_trip(url: str) -> None:
    for text in ("Hello world, naïve café 日本語 🙂", "  two  spaces\n\nand lines", "<|im_start|>literal"):
        tokenized = post(url, "/tokenize", {"model": "tiny", "prompt": text, "return_token_strs": True}).json()
        assert tokenized["count"] == len(tokenized["tokens"]) == len(tokenized["token_strs"])
        assert tokenized["max_model_len"] == 4096  # the engine's, once it has handshaken
        assert post(url, "/detokenize", {"model": "tiny", "tokens": tokenized["tokens"]}).json() == {"prompt": text}


def test_the_chat_form_counts_what_the_chat_route_counts(url: str, client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                               "parameters": {"type": "object",
                                                              "properties": {"word": {"type": "string"}}}}}]
    for extra in ({}, {"tools": tools}, {"chat_template_kwargs": {"enable_thinking": False}}):
        count = post(url, "/tokenize", {"model": "tiny", "messages": CHAT, **extra}).json()["count"]
        choice: dict[str, Any] = {"tool_choice": "none"} if "tools" in extra else {}
        reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                               extra_body={**extra, **choice})
        assert reply.usage is not None and reply.usage.prompt_tokens == count


def _generate(url: str, rendered: dict[str, Any]) -> tuple[list[int], str, str]:
    """Token ids, text and finish reason from /inference/v1/generate, whole and streamed (which must agree)."""
    whole = post(url, "/inference/v1/generate", {**rendered, "return_text": True})
    assert whole.status_code == 200, whole.text
    [choice] = whole.json()["choices"]
    events = sse(post(url, "/inference/v1/generate", {**rendered, "stream": True, "return_text": True,
                                                      "stream_options": {"include_usage": True}}))
    assert events[-1] == "[DONE]" and events[-2]["usage"] == whole.json()["usage"]
    chunks = [e["choices"][0] for e in events[:-2]]
    assert [c["finish_reason"] for c in chunks][-1] == choice["finish_reason"]
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]
    assert "".join(c["text"] for c in chunks) == choice["text"]
    return choice["token_ids"], choice["text"], choice["finish_reason"]


@pytest.mark.parametrize("case", ["plain", "stop", "seed"])
def test_render_then_generate_gives_the_chat_route_s_tokens(url: str, client: openai.OpenAI, case: str) -> None:
    body = {"model": "tiny", "messages": CHAT, "temperature": 0, "max_tokens": 24}
    if case == "stop":  # a stop string the reply runs into: four characters from its middle
        full = client.chat.completions.create(**body).choices[0].message.content  # type: ignore[call-overload]
        body["stop"] = [full[20:24]]
    elif case == "seed":
        body.update(max_tokens=16, seed=5)
    reply = client.chat.completions.create(**body)  # type: ignore[call-overload]
    assert (reply.choices[0].finish_reason == "stop") == (case == "stop")
    rendered = post(url, "/v1/chat/completions/render", body).json()
    assert len(rendered["token_ids"]) == reply.usage.prompt_tokens
    ids, text, finish = _generate(url, rendered)
    assert text == reply.choices[0].message.content and finish == reply.choices[0].finish_reason
    assert len(ids) == reply.usage.completion_tokens
    # The ids are the tokens themselves: their text is the reply's (a stop string cut it there).
    decoded = post(url, "/detokenize", {"tokens": ids}).json()["prompt"]
    assert decoded.startswith(text) and (finish == "stop" or decoded == text)


def test_completion_render_then_generate_gives_the_completions_route_s_tokens(url: str,
                                                                              client: openai.OpenAI) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}
    reply = client.completions.create(**body)  # type: ignore[call-overload]
    [rendered] = post(url, "/v1/completions/render", body).json()
    ids, text, _ = _generate(url, rendered)
    assert text == reply.choices[0].text and len(ids) == reply.usage.completion_tokens


def test_generate_gives_the_logprobs_completions_give_in_vllm_s_token_in_shape(url: str, client: openai.OpenAI) -> None:
    """The same tokens' logprobs as /v1/completions (the sim's fake distribution), with ids for strings:
    each entry's alternatives the first k of vLLM's dict (the token, then the most likely)."""
    ids = [9707, 11, 1879, 0, 358]
    reply = client.completions.create(model="tiny", prompt=ids, max_tokens=8, seed=4, logprobs=3,
                                      extra_body={"prompt_logprobs": 2})
    body = {"token_ids": ids, "sampling_params": {"max_tokens": 8, "seed": 4, "logprobs": 3, "prompt_logprobs": 2}}
    answer = post(url, "/inference/v1/generate", body).json()
    [choice] = answer["choices"]
    content = choice["logprobs"]["content"]
    assert [e["token_id"] for e in content] == choice["token_ids"]
    assert [e["logprob"] for e in content] == reply.choices[0].logprobs.token_logprobs
    assert answer["prompt_logprobs"] == reply.choices[0].prompt_logprobs  # type: ignore[attr-defined]
    for entry, tops in zip(content, reply.choices[0].logprobs.top_logprobs, strict=True):
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["token_id"] == entry["token_id"]
        assert entry["rank"] >= 1 and all(set(t) == {"token_id", "logprob", "rank"} for t in entry["top_logprobs"])
        assert sorted(t["logprob"] for t in entry["top_logprobs"]) == sorted(list(tops.values())[:3])
    streamed = sse(post(url, "/inference/v1/generate", {**body, "stream": True,
                                                        "sampling_params": {**body["sampling_params"],
                                                                            "prompt_logprobs": None}}))
    chunks = [c for c in streamed[:-1] if c["choices"]]
    assert [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]] == content
    assert all(len(c["choices"][0]["logprobs"]["content"]) == len(c["choices"][0]["token_ids"]) for c in chunks)


def test_bad_input_is_a_400_naming_the_field(url: str) -> None:
    for path, body, param in (
            ("/tokenize", {"prompt": 3}, "prompt"),
            ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
            ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
            ("/v1/chat/completions/render", {"model": "tiny", "messages": CHAT, "top_p": 0}, "top_p"),
            ("/v1/completions/render", {"model": "tiny", "prompt": "x", "n": 0}, "n"),
            ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"logprobs": 21}},
             "sampling_params.logprobs"),
            ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"max_tokens": 10**6}},
             "sampling_params.max_tokens"),
            ("/inference/v1/generate", {"token_ids": [1]}, "sampling_params")):
        response = post(url, path, body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_version(url: str) -> None:
    assert httpx.get(url + "/version").json() == {"version": "0.1.0"}


@pytest.fixture(scope="module")
def render_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    """`frontend --render-only --model tiny`: nothing else, no engine anywhere."""
    fe = start_frontend(tmp_path_factory.mktemp("render-only"), "--render-only")
    yield fe
    fe.stop()


def test_a_render_only_frontend_starts_without_an_engine(render_only: FrontendProc) -> None:
    assert httpx.get(render_only.url + "/ready").json() == {"ready": True, "render_only": True}
    assert "render-only: no engines" in render_only.log()
    with openai.OpenAI(base_url=render_only.url + "/v1", api_key="unused", max_retries=0) as c:
        assert [m.max_model_len for m in c.models.list().data] == [4096]  # type: ignore[attr-defined]
        with pytest.raises(openai.NotFoundError, match="--render-only"):
            c.chat.completions.create(model="tiny", messages=CHAT)  # type: ignore[arg-type]
    assert post(render_only.url, "/inference/v1/generate", {"token_ids": [1], "sampling_params": {}}).status_code == 404


def test_a_gateway_renders_on_one_frontend_and_generates_on_another(render_only: FrontendProc, url: str,
                                                                    client: openai.OpenAI) -> None:
    body = {"model": "tiny", "messages": CHAT, "temperature": 0, "max_tokens": 20, "stop": ["."]}
    rendered = post(render_only.url, "/v1/chat/completions/render", body).json()
    assert rendered["token_ids"] == post(url, "/v1/chat/completions/render", body).json()["token_ids"]
    reply = client.chat.completions.create(**body)  # type: ignore[call-overload]
    _, text, finish = _generate(url, rendered)
    assert (text, finish) == (reply.choices[0].message.content, reply.choices[0].finish_reason)


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory, url: str) -> Iterator[anthropic.Anthropic]:
    """A router in front of the frontend, spoken to with the anthropic SDK."""
    router: HttpProc = start_router(tmp_path_factory.mktemp("router"), f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {url}}}], health: {{path: /ready, interval_s: 0.2}}}}
entries:
  claude-tiny: {{default: [tiny]}}
""")
    try:
        with anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0, timeout=60) as c:
            yield c
    finally:
        router.stop()


def test_count_tokens_through_the_router_counts_what_messages_bills(claude: anthropic.Anthropic, url: str) -> None:
    tools: list[Any] = [{"name": "lookup", "description": "Look a word up",
                         "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}}}]
    system = "You are terse."
    # tool_choice none: the frontend here parses no calls ("auto" needs its parser flags); tools still render.
    for extra in ({}, {"tools": tools, "tool_choice": {"type": "none"}}, {"thinking": {"type": "disabled"}}):
        messages: list[Any] = [{"role": "user", "content": f"Count me {sorted(extra)}"}]
        counted = claude.messages.count_tokens(model="claude-tiny", system=system, messages=messages, **extra)
        reply = claude.messages.create(model="claude-tiny", system=system, messages=messages, max_tokens=2, **extra)
        assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "Count me []"}]
    assert counted.input_tokens > 0
    alone = claude.messages.count_tokens(model="claude-tiny", system=system,
                                         messages=[{"role": "user", "content": "Count me []"}])
    assert alone.input_tokens == post(url, "/tokenize", {"messages": chat}).json()["count"]


def test_count_tokens_refusals_are_anthropic_s(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.count_tokens(model="claude-tiny",
                                     messages=[{"role": "robot", "content": "x"}])  # type: ignore[list-item,typeddict-item]
    assert bad.value.body["error"]["message"].startswith("messages[0].role")  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "x"}])
