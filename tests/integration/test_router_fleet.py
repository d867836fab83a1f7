"""The router in front of real frontends over headless sim engines, all separate processes, driven by
the official openai and anthropic SDKs: chat, completions, responses and messages, streamed and not."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.support.procs import EngineProc, FrontendProc, HttpProc, start_engine, start_frontend, start_router

KEY = "sk-router-test"
CHAT = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[FrontendProc], HttpProc]]:
    """Two instances (a frontend with its own sim engine each) behind one router pool."""
    tmp = tmp_path_factory.mktemp("router-fleet")
    engines: list[EngineProc] = []
    frontends: list[FrontendProc] = []
    router = None
    try:
        for _ in range(2):
            engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1")
            engines.append(engine)
            frontends.append(start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                            "--engine-addresses", engine.endpoint()))
        replicas = ", ".join(f"{{url: {fe.url}}}" for fe in frontends)
        router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}]}}]
pools:
  tiny:
    model: tiny
    replicas: [{replicas}]
    policy: cache_aware
    tokenizer: tiny
    health: {{path: /ready, interval_s: 1}}
entries:
  assistant:
    signals:
      - {{name: long, type: context_length, min_tokens: 1000}}
    decisions:
      - {{name: long-context, when: long, pools: [tiny]}}
    default: [tiny]
""")
        yield frontends, router
    finally:
        if router is not None:
            router.stop()
        for proc in [*frontends, *engines]:
            proc.stop()


@pytest.fixture(scope="module")
def client(fleet: tuple[list[FrontendProc], HttpProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[1].url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def claude(fleet: tuple[list[FrontendProc], HttpProc]) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fleet[1].url, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_openai_chat_through_the_router(client: openai.OpenAI, fleet) -> None:  # type: ignore[no-untyped-def]
    raw = client.chat.completions.with_raw_response.create(model="assistant", messages=CHAT, max_tokens=8)
    r = raw.parse()
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.model == "tiny"  # the backend's served name: the router rewrote the entry name
    assert raw.headers["x-router-replica"] in {fe.url for fe in fleet[0]}
    assert raw.headers["x-router-decision"] == "default"


def test_openai_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="assistant", messages=CHAT, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_openai_completions_streamed_and_not(client: openai.OpenAI) -> None:
    r = client.completions.create(model="assistant", prompt="Once upon a time", max_tokens=5)
    assert r.choices[0].text and r.usage is not None and r.usage.completion_tokens == 5
    pieces = [c.choices[0].text for c in client.completions.create(
        model="assistant", prompt="Once upon a time", max_tokens=5, stream=True) if c.choices]
    assert "".join(pieces)


def test_openai_responses_streamed_and_not(client: openai.OpenAI) -> None:
    r = client.responses.create(model="assistant", input="Say something", max_output_tokens=7,
                                instructions="Be brief.")
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.output_text and r.usage is not None and r.usage.output_tokens == 7
    events = list(client.responses.create(model="assistant", input=[{"role": "user", "content": "Hi"}],
                                          max_output_tokens=5, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text


def test_responses_extras_reach_the_frontend_and_its_refusals_name_the_clients_field(client: openai.OpenAI) -> None:
    r = client.responses.create(model="assistant", input="Say something", max_output_tokens=6, top_logprobs=2,
                                extra_body={"seed": 7, "top_k": 5, "min_p": 0.05, "stop": ["\u2603"]})
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and len(part.logprobs or []) == 6  # one per token, from the frontend
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs or [])
    again = client.responses.create(model="assistant", input="Say something", max_output_tokens=6,
                                    extra_body={"seed": 7, "top_k": 5, "min_p": 0.05})
    assert again.output_text == r.output_text  # the seed reached the engine
    with pytest.raises(openai.BadRequestError) as err:  # carried to the frontend, whose sim engines refuse it
        client.responses.create(model="assistant", input="x", extra_body={"logit_bias": {"5": 1.0}})
    assert err.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="assistant", input="x", max_output_tokens=10**6)
    assert err.value.param == "max_output_tokens" and "max_tokens" not in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="assistant", input="x", extra_body={"respone_format": {"type": "json_object"}})
    assert err.value.param == "respone_format"


def test_anthropic_messages_streamed_and_not(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model="assistant", max_tokens=6, system="Be brief.",
                               messages=[{"role": "user", "content": "Hello"}])
    assert m.stop_reason == "max_tokens" and m.content[0].type == "text" and m.content[0].text
    assert m.usage.output_tokens == 6 and m.usage.input_tokens > 0
    with claude.messages.stream(model="assistant", max_tokens=5,
                                messages=[{"role": "user", "content": "Hello"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 5


def test_anthropic_errors_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="no-such-entry", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="assistant", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                               extra_body={"temperature": 3.0})
    assert "temperature" in bad.value.message


def test_errors_from_the_frontend_pass_through(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="assistant", messages=CHAT, max_tokens=0)
    assert err.value.param == "max_tokens"
    with openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()


def test_cache_aware_sends_a_repeated_prefix_to_the_same_instance(fleet) -> None:  # type: ignore[no-untyped-def]
    router = fleet[1]
    prefix = "Here is a long shared document. " + " ".join(f"word{i}" for i in range(600))
    homes = set()
    cached = []
    for i in range(4):
        r = httpx.post(router.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=60,
                       json={"model": "assistant", "max_tokens": 2,
                             "messages": [{"role": "user", "content": f"{prefix} question {i}"}]})
        assert r.status_code == 200, r.text
        homes.add(r.headers["x-router-replica"])
        assert r.headers["x-router-decision"] == "long-context"  # counted with the pool's tokenizer
        cached.append((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    assert len(homes) == 1
    assert cached[0] == 0 and all(c > 500 for c in cached[1:])  # the instance's engine prefix cache hit


def test_a_replica_killed_under_load_is_retried_around_and_serves_again_at_its_first_passing_check(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two frontends behind the router under steady load; SIGKILL one: every request is retried on the
    other before its first byte, the killed one's breaker opens; restarted on its port, it is used again
    once a health check passes, though the breaker's cool-down (600 s) is far from over."""
    tmp = tmp_path_factory.mktemp("router-chaos")
    engines = [start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1") for _ in range(2)]
    args = [("--data-parallel-size-local", "0", "--engine-addresses", e.endpoint()) for e in engines]
    frontends = [start_frontend(tmp, *a) for a in args]
    replicas = ", ".join(f"{{url: {fe.url}}}" for fe in frontends)
    router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}]}}]
pools:
  tiny:
    model: tiny
    replicas: [{replicas}]
    health: {{path: /ready, interval_s: 0.5, timeout_s: 1}}
    breaker: {{failures: 2, cooldown_s: 600}}
entries:
  assistant: {{default: [tiny]}}
""")
    victim = frontends[1]
    answers: list[tuple[float, int, str, str]] = []  # (sent at, status, replica, attempts)
    failed: dict[float, str] = {}  # sent at -> the error body
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(headers={"authorization": f"Bearer {KEY}"}, timeout=30) as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = c.post(router.url + "/v1/chat/completions",
                           json={"model": "assistant", "messages": CHAT, "max_tokens": 4})
                answers.append((sent, r.status_code, r.headers.get("x-router-replica", ""),
                                r.headers.get("x-router-attempts", "")))
                if r.status_code != 200:
                    failed[sent] = r.text

    def breaker() -> str:
        state = httpx.post(router.url + "/v1/router/explain", headers={"authorization": f"Bearer {KEY}"}, timeout=10,
                           json={"model": "assistant", "messages": CHAT}).json()["replicas"]
        return next(r["breaker"] for r in state if r["url"] == victim.url)

    workers = [threading.Thread(target=load) for _ in range(4)]
    try:
        for w in workers:
            w.start()
        deadline = time.monotonic() + 30
        while not {a[2] for a in answers} >= {fe.url for fe in frontends}:  # both serve
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed = time.monotonic()
        victim.proc.kill()
        victim.proc.wait(10)
        while breaker() != "open":
            assert time.monotonic() < deadline + 30, "the breaker never opened"
            time.sleep(0.02)
        opened_at = time.monotonic()
        opened = opened_at - killed
        time.sleep(0.5)  # more load while it is out
        frontends[1] = victim = start_frontend(tmp, *args[1], port=victim.port)  # returns once /ready is 200
        ready = time.monotonic()
        while not any(a[0] > ready and a[2] == victim.url and a[1] == 200 for a in answers):
            assert time.monotonic() < ready + 60, "the restarted replica was never used again"
            time.sleep(0.02)
        used = min(a[0] for a in answers if a[0] > ready and a[2] == victim.url)
        stop.set()
        for w in workers:
            w.join(30)
        print(f"router: breaker open {opened * 1000:.0f} ms after SIGKILL; restarted replica used again "
              f"{(used - ready) * 1000:.0f} ms after its /ready answered 200 (cool-down 600 s)")
        # A request running on it at the kill may have run there: a 502 saying so, never sent elsewhere.
        # Every later one the dead replica refused to connect is retried on the other.
        for sent, status, _, _ in answers:
            if status != 200:
                assert status == 502 and "not retried on another replica" in failed[sent], failed[sent]
                assert sent < opened_at
        assert len(failed) <= 2 * len(workers)  # those in flight at the kill (and the FIN's race), no more
        # (Whether a request met a refused connection before the breaker opened, and was retried, is a race:
        # with 4 clients each may have been answered 502 or sent to the other replica. The retry of a refused
        # connection is shown in tests/unit/router/test_dispatch.py and test_router.py.)
        assert breaker() == "closed"
        assert "after being down: its breaker is closed" in router.log()
    finally:
        stop.set()
        for w in workers:
            w.join(30)
        router.stop()
        for proc in [*frontends, *engines]:
            proc.stop()
