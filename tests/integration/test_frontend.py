"""The frontend as a separate process over headless sim engines on tcp loopback, driven by the
official openai SDK (and raw HTTP for malformed input)."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from services.frontend.config import HTTP_SERVERS
from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, FrontendProc, start_engine, start_frontend

SIM = ("--model", "tiny", "--backend", "sim")


def _frontend_args(engine: EngineProc, ranks: int, *extra: str) -> list[str]:
    addresses = ",".join(engine.endpoint(i) for i in range(ranks))
    return ["--data-parallel-size", str(ranks), "--data-parallel-size-local", "0",
            "--engine-addresses", addresses, "--engine-timeout", "1.0", *extra]


@pytest.fixture(scope="module", params=HTTP_SERVERS)
def fleet(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProc, FrontendProc]]:
    """Two headless sim ranks (one command) and a frontend with --data-parallel-size-local 0, on each
    HTTP server it can run (the module's tests run once per server); SIGTERM then stops it cleanly."""
    tmp = tmp_path_factory.mktemp("fleet")
    engine = start_engine(tmp, *SIM, "--sim-decode-ms", "1", ranks=2)
    try:
        fe = start_frontend(tmp, *_frontend_args(engine, 2, "--http-server", request.param))
        yield engine, fe
        assert fe.stop() == 0, fe.log()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def client(fleet: tuple[EngineProc, FrontendProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[1].url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


CHAT = [{"role": "user", "content": "Hello there"}]


def test_models_and_health(client: openai.OpenAI, fleet) -> None:  # type: ignore[no-untyped-def]
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(fleet[1].url + "/health").status_code == 200
    ready = httpx.get(fleet[1].url + "/ready").json()
    assert ready == {"ready": True, "ranks": [0, 1]}


def test_chat_non_streaming_with_usage(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=1)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 5 and r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_streaming_with_usage_matches_non_streaming(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, seed=7)
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, seed=7, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20  # type: ignore[union-attr]


def test_continuous_usage_stats_on_every_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))  # type: ignore[typeddict-unknown-key]
    counted = [c.usage.completion_tokens for c in chunks if c.choices]  # type: ignore[union-attr]
    assert len(counted) == len([c for c in chunks if c.choices]) and counted == sorted(counted)
    assert 1 <= counted[0] and counted[-1] == 12  # the finish chunk carries the final count
    prompt = {c.usage.prompt_tokens for c in chunks}  # type: ignore[union-attr]
    assert len(prompt) == 1 and chunks[-1].usage.total_tokens == prompt.pop() + 12  # type: ignore[union-attr]
    chat = list(client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))  # type: ignore[typeddict-unknown-key]
    assert chat[0].choices[0].delta.role == "assistant" and chat[0].usage.completion_tokens == 0  # type: ignore[union-attr]
    assert [c.usage.completion_tokens for c in chat if c.choices][-1] == 3  # type: ignore[union-attr]
    # Without include_usage there is no usage anywhere, as vLLM does.
    plain = list(client.completions.create(model="tiny", prompt="Once", max_tokens=3, stream=True,
                                           stream_options={"continuous_usage_stats": True}))  # type: ignore[typeddict-unknown-key]
    assert all(c.usage is None for c in plain)


def test_completions_streamed_and_not(client: openai.OpenAI) -> None:
    full = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, seed=3)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 10  # type: ignore[union-attr]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=10, seed=3, stream=True) if c.choices)
    assert streamed == full.choices[0].text


def test_stop_string_split_across_tokens(client: openai.OpenAI) -> None:
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=40, seed=11, stream=True) if c.choices]
    pieces = [p for p in pieces if p]
    # A stop string made of the end of one streamed token and the start of the next.
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    full = "".join(pieces)
    expected = full[: full.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=11,
                                                         stop=[stop], stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finish == ["stop"]
        else:
            r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=11, stop=[stop])
            text = r.choices[0].message.content or ""
            assert r.choices[0].finish_reason == "stop"
        assert text == expected and stop not in text


def test_the_largest_allowed_stop_list_is_matched_and_a_longer_one_is_a_400(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=11)
    full = reply.choices[0].message.content
    assert full is not None and len(full) > 20
    stop = full[12:16]
    held = full[:8] + "\x00" * 5000  # runs along the text's start, so it is held back, then released
    size = (MAX_STOP_CHARS - len(stop) - len(held)) // (MAX_STOP_STRINGS - 2)
    stops = [stop, held, *(f"\x01{i:02}" + "\x02" * (size - 3) for i in range(MAX_STOP_STRINGS - 2))]
    for stream in (False, True):
        if stream:
            chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=11,
                                                         stop=stops, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        else:
            r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=11, stop=stops)
            text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        assert (text, finish) == (full[:full.index(stop)], "stop")
    for over in ([*stops, "x"], [*stops[:-1], stops[-1] + "x" * (MAX_STOP_CHARS - sum(map(len, stops)) + 1)]):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, stop=over)
        assert err.value.body["param"] == "stop" and "at most" in err.value.body["message"]  # type: ignore[index]


def test_pin_header_selects_the_rank(client: openai.OpenAI) -> None:
    for rank in (0, 1, 1, 0):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=CHAT, max_tokens=2, extra_headers={"X-Data-Parallel-Rank": str(rank)})
        assert raw.headers["x-data-parallel-rank"] == str(rank)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2,
                                       extra_headers={"X-Data-Parallel-Rank": "7"})
    assert err.value.status_code == 400 and "not a rank" in str(err.value)


def test_unpinned_requests_spread_over_both_ranks(client: openai.OpenAI) -> None:
    ranks = {client.chat.completions.with_raw_response.create(
        model="tiny", messages=CHAT, max_tokens=2).headers["x-data-parallel-rank"] for _ in range(6)}
    assert ranks == {"0", "1"}


def test_disconnect_aborts_the_engine_request(client: openai.OpenAI, fleet) -> None:  # type: ignore[no-untyped-def]
    engine, _ = fleet
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3000, stream=True,
                                            extra_headers={"X-Data-Parallel-Rank": "1"})
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    watcher = EngineClient(engine.endpoint(1))
    try:
        assert watcher.handshake(timeout_s=10).__class__.__name__ == "Ready"
        deadline = time.monotonic() + 10
        while True:
            stats = watcher.utility("stats").result
            if stats["in_flight"] == 0:
                break
            assert time.monotonic() < deadline, f"engine still runs the request: {stats}"
            time.sleep(0.1)
    finally:
        watcher.close()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"model": "tiny"}', 400, "messages: this field is required"),
        (b'{"model": "tiny", "messages": "hi"}', 400, "messages: expected `array`, got `str`"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}', 400,
         "max_tokens: expected `int | null`, got `str`"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 9}', 400,
         "temperature=9.0 is out of range: must be in [0, 2]"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_p": 0}', 400,
         "top_p=0.0 is out of range"),
        (b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "gpt-9"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400,
         "maximum context length is 4096 tokens. However, you requested"),
    ],
)
def test_bad_input_gets_openai_error_body(fleet, body: bytes, status: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(fleet[1].url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"], error


def test_body_over_limit_is_413(fleet) -> None:  # type: ignore[no-untyped-def]
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * (5 * 2**20)}]})
    r = httpx.post(fleet[1].url + "/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_bad_input_via_sdk_names_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=5, extra_body={"min_p": 3.0})
    assert "min_p" in str(err.value)
    r = client.completions.create(model="tiny", prompt="still fine", max_tokens=2)
    assert r.choices[0].finish_reason == "length"  # the server carries on


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProc]:
    """A frontend on one sim rank that replays each prompt's ids as its output (--sim-echo)."""
    tmp = tmp_path_factory.mktemp("echo")
    engine = start_engine(tmp, *SIM, "--sim-instant", "--sim-echo")
    try:
        fe = start_frontend(tmp, *_frontend_args(engine, 1))
        yield fe
        fe.stop()
    finally:
        engine.stop()


def test_chinese_text_streams_byte_exact(echo: FrontendProc) -> None:
    text = "数据并行引擎把中文字符拆成多个字节的词元：你好，世界！🙂 混合 English 文本。"
    client = openai.OpenAI(base_url=echo.url + "/v1", api_key="x", max_retries=0)
    n = client.completions.create(model="tiny", prompt=text, max_tokens=1).usage.prompt_tokens  # type: ignore[union-attr]
    chunks = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=text, max_tokens=n, stream=True) if c.choices]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    client.close()


def test_the_stop_token_is_no_text_unless_include_stop_str_in_output(echo: FrontendProc) -> None:
    """As vLLM: the token that ended a request (a stop_token_ids entry, or EOS) is detokenized only with
    include_stop_str_in_output. The echo sim replays the prompt's ids, so the stop token is known."""
    hello, world, comma, this, is_, a, im_end = 9707, 1879, 11, 419, 374, 264, 151645
    cases = [  # prompt ids, the stop token id, skip_special_tokens, text without and with the stop token
        ([hello, world, comma, this, is_, a], is_, True, "Hello world, this", "Hello world, this is"),
        ([hello, world, im_end, a], im_end, False, "Hello world", "Hello world<|im_end|>"),
    ]
    with openai.OpenAI(base_url=echo.url + "/v1", api_key="x", max_retries=0) as client:
        for prompt, stop, skip, without, with_stop in cases:
            for include in (False, True):
                extra = {"stop_token_ids": [stop], "include_stop_str_in_output": include,
                         "skip_special_tokens": skip}
                r = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, extra_body=extra)
                streamed = [c.choices[0] for c in client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=10, extra_body=extra, stream=True) if c.choices]
                expected = with_stop if include else without
                assert (r.choices[0].text, r.choices[0].finish_reason) == (expected, "stop")
                assert r.choices[0].stop_reason == stop  # type: ignore[attr-defined]
                assert ("".join(c.text for c in streamed), streamed[-1].finish_reason) == (expected, "stop")
                assert r.usage is not None and r.usage.completion_tokens == prompt.index(stop) + 1


def test_long_prompt_is_tokenized_off_the_loop_and_served(client: openai.OpenAI) -> None:
    long = "数据 and words " * 400  # past --long-prompt-chars: rendered and tokenized in a worker thread
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}], max_tokens=3)
    assert r.usage.prompt_tokens > 1000 and r.choices[0].finish_reason == "length"  # type: ignore[union-attr]


def test_metrics_use_vllm_names(client: openai.OpenAI, fleet) -> None:  # type: ignore[no-untyped-def]
    client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, stream=True).close()
    client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3)
    text = httpx.get(fleet[1].url + "/metrics").text
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_sum", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:request_success_total"):
        assert f'{name}' in text, name
    gen = [line for line in text.splitlines() if line.startswith("vllm:generation_tokens_total")]
    assert float(gen[0].rsplit(" ", 1)[1]) >= 3


def test_api_server_count_two_processes_share_the_port(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-instant")
    try:
        fe = start_frontend(tmp_path, *_frontend_args(engine, 1), "--api-server-count", "2")
    except BaseException:
        engine.stop()
        raise
    watcher = EngineClient(engine.endpoint())
    try:
        assert watcher.handshake(timeout_s=10).__class__.__name__ == "Ready"
        deadline = time.monotonic() + 30
        while watcher.utility("stats").result["peers"] < 3:  # two API servers and this watcher
            assert time.monotonic() < deadline, "the second API server never connected to the engine"
            time.sleep(0.1)
        for _ in range(4):  # fresh connections each: the kernel may pick either process
            r = httpx.post(fe.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert "API server 1 serving" in fe.log()
    finally:
        watcher.close()
        assert fe.stop() == 0
        engine.stop()


def test_disconnect_aborts_even_when_ranks_do_not_match_list_positions(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "2", "--data-parallel-start-rank", "3")
    try:
        fe = start_frontend(tmp_path, *_frontend_args(engine, 1))
    except BaseException:
        engine.stop()
        raise
    watcher = EngineClient(engine.endpoint())
    try:
        with openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0) as client:
            stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3000, stream=True)
            for i, _chunk in enumerate(stream):
                if i == 3:
                    break
            stream.close()
        assert watcher.handshake(timeout_s=10).rank == 3  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while watcher.utility("stats").result["in_flight"] != 0:
            assert time.monotonic() < deadline, "the engine still runs the abandoned request"
            time.sleep(0.1)
    finally:
        watcher.close()
        fe.stop()
        engine.stop()
