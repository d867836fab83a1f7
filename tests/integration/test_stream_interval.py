"""stream_interval, vLLM's: a stream is sent its first token at once, then a chunk per N tokens (one
event, the tokens' text joined) and its end; the server's --stream-interval is a floor a request may
raise, not lower. Real processes: a frontend started with --stream-interval 3 over a sim engine."""
from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.procs import openai_over_sim

CHAT = [{"role": "user", "content": "Stream this in chunks"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    # Tokens 20 ms apart (a GPU's pace): on a loaded host the frontend still reads the first one alone.
    with openai_over_sim(tmp_path_factory.mktemp("interval"), ["--sim-decode-ms", "20"],
                         ["--stream-interval", "3"]) as c:
        yield c


def _chunk_tokens(client: openai.OpenAI, **kwargs: object) -> tuple[list[int], str]:
    """Tokens each content chunk carried (from continuous usage), and the streamed text."""
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, seed=2, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True},
                                            **kwargs)  # type: ignore[call-overload]
    sizes, text, before = [], "", 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            sizes.append(chunk.usage.completion_tokens - before)
            before = chunk.usage.completion_tokens
            text += chunk.choices[0].delta.content
    return sizes, text


def test_the_server_interval_sends_the_first_token_then_chunks_of_three(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, seed=2)
    sizes, text = _chunk_tokens(client)
    assert text == whole.choices[0].message.content
    assert sizes[0] == 1 and sum(sizes) <= 20  # a token ending inside a character may carry no text
    assert all(size >= 3 for size in sizes[1:-1]) and len(sizes) <= 1 + 19 // 3 + 1, sizes


def test_a_request_raises_the_interval_and_cannot_lower_it(client: openai.OpenAI) -> None:
    sizes, _ = _chunk_tokens(client, extra_body={"stream_interval": 8})
    assert sizes[0] == 1 and all(size >= 8 for size in sizes[1:-1]) and len(sizes) <= 4, sizes
    lower, _ = _chunk_tokens(client, extra_body={"stream_interval": 1})
    assert all(size >= 3 for size in lower[1:-1]), lower
    with pytest.raises(openai.BadRequestError) as info:
        _chunk_tokens(client, extra_body={"stream_interval": 0})
    assert info.value.body["param"] == "stream_interval"  # type: ignore[index]


def test_logprobs_come_with_their_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, seed=2, stream=True,
                                            logprobs=True, top_logprobs=1)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            entries = chunk.choices[0].logprobs.content
            assert "".join(e.token for e in entries) == chunk.choices[0].delta.content
