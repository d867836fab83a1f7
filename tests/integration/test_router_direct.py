"""Direct calls to a published chat pool, every part its own process on real sockets: a router whose
listener publishes the pool `tiny` (a frontend over a headless sim engine) beside a chat entry whose
keyword signal routes elsewhere (the chat test backend). The openai SDK's chat, completions and
Responses calls and the anthropic SDK's Messages call naming the pool go straight to it (decision
`direct`); an unpublished pool is the same 404 as an unknown model; /v1/models lists the pool."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.procs import (
    EngineProc,
    FrontendProc,
    HttpProc,
    free_port_block,
    start_backend,
    start_engine,
    start_frontend,
    start_router,
)

KEY = "sk-direct"
HELLO = [{"role": "user", "content": "hello there"}]
CONFIG = """
listeners:
  - {{port: {{port}}, host: 127.0.0.1, api_keys: [{key}], pools: [tiny]}}
  - {{port: {other}, host: 127.0.0.1, name: other, api_keys: [{key}]}}
pools:
  tiny: {{model: tiny, replicas: [{{url: "{frontend}"}}], health: {{path: /ready, interval_s: 1}}}}
  elsewhere: {{model: elsewhere-m, replicas: [{{url: "{backend}"}}]}}
  hidden: {{model: hidden-m, replicas: [{{url: "{backend}"}}]}}
entries:
  assistant:
    signals: [{{name: greeting, type: keyword, keywords: [hello]}}]
    decisions: [{{name: greet, when: greeting, pools: [elsewhere]}}]
    default: [elsewhere]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpProc, HttpProc, int]]:
    tmp: Path = tmp_path_factory.mktemp("direct")
    procs: list[EngineProc | FrontendProc | HttpProc] = []
    try:
        engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1")
        procs.append(engine)
        frontend = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                  "--engine-addresses", engine.endpoint())
        procs.append(frontend)
        backend = start_backend(tmp, "backend")
        procs.append(backend)
        other = free_port_block(1, spread=0)
        router = start_router(tmp, CONFIG.format(key=KEY, other=other, frontend=frontend.url,
                                                           backend=backend.url))
        procs.append(router)
        yield router, backend, other
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture(scope="module")
def client(fleet: tuple[HttpProc, HttpProc, int]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[0].url + "/v1", api_key=KEY, max_retries=0, timeout=60) as sdk:
        yield sdk


def test_the_entry_routes_hello_elsewhere(client: openai.OpenAI) -> None:
    """The control: through the entry, the keyword sends the same text to the other pool."""
    raw = client.chat.completions.with_raw_response.create(model="assistant", messages=HELLO)
    assert (raw.headers["x-router-decision"], raw.headers["x-router-pool"]) == ("greet", "elsewhere")
    assert raw.parse().choices[0].message.content == "backend:elsewhere-m"


def test_openai_chat_naming_the_pool_goes_straight_to_it(client: openai.OpenAI,
                                                          fleet: tuple[HttpProc, HttpProc, int]) -> None:
    before = fleet[1].stats()["requests"]
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=HELLO,
                                                           max_tokens=8)
    assert (raw.headers["x-router-entry"], raw.headers["x-router-decision"], raw.headers["x-router-pool"]) == (
        "tiny", "direct", "tiny")
    answer = raw.parse()
    assert answer.model == "tiny" and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 8  # the sim engine generated it
    assert fleet[1].stats()["requests"] == before  # the keyword's pool was never called
    streamed = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4,
                                              stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)


def test_completions_and_responses_naming_the_pool_go_straight_to_it(client: openai.OpenAI) -> None:
    completion = client.completions.with_raw_response.create(model="tiny", prompt="hello", max_tokens=4)
    assert completion.headers["x-router-decision"] == "direct" and completion.parse().choices[0].text
    response = client.responses.with_raw_response.create(model="tiny", input="hello", max_output_tokens=8)
    assert response.headers["x-router-decision"] == "direct" and response.parse().output_text


def test_anthropic_messages_naming_the_pool_go_straight_to_it(fleet: tuple[HttpProc, HttpProc, int]) -> None:
    with anthropic.Anthropic(base_url=fleet[0].url, api_key=KEY, max_retries=0, timeout=60) as claude:
        raw = claude.messages.with_raw_response.create(model="tiny", max_tokens=8,
                                                      messages=HELLO)
    assert (raw.headers["x-router-decision"], raw.headers["x-router-pool"]) == ("direct", "tiny")
    message = raw.parse()
    assert message.content and message.usage.output_tokens == 8


def test_an_unpublished_pool_is_the_same_404_as_an_unknown_model(client: openai.OpenAI,
                                                                 fleet: tuple[HttpProc, HttpProc, int]) -> None:
    with pytest.raises(openai.NotFoundError) as hidden:
        client.chat.completions.create(model="hidden", messages=HELLO)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="nothing", messages=HELLO)
    assert hidden.value.param == unknown.value.param == "model"
    assert hidden.value.message.replace("hidden", "nothing") == unknown.value.message
    # The other listener publishes no pool: `tiny` is unknown there.
    with openai.OpenAI(base_url=f"http://127.0.0.1:{fleet[2]}/v1", api_key=KEY, max_retries=0, timeout=60) as other:
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(model="tiny", messages=HELLO)


def test_models_lists_the_published_pool_after_the_entries(fleet: tuple[HttpProc, HttpProc, int]) -> None:
    listed = httpx.get(fleet[0].url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert [model["id"] for model in listed["data"]] == ["assistant", "tiny"]
