"""The semantic cache in a real router process (YAML: a SQLite store in a temporary folder, a managed sim
embed deployment, the test backend as the chat pool, which counts the calls it gets), spoken to with
the official openai and anthropic SDKs: a repeat is a hit the backend never sees, hits are replayed as
well-formed chat, Responses and Messages streams, a streamed miss is stored, a cut-off answer is not,
API keys and users are isolated unless the cache is shared, the cache survives a restart, and a hit is
reported in a header and a metric."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

# The store's SQLite backend (and the server wiring that opens it) land beside this module.
from tests.support.cache_fleet import KEY_A, KEY_B, REPLY, Fleet

CONFIG = """
listeners:
  - {port: {port}, host: 127.0.0.1, api_keys: [key-a, key-b]}
pools:
  chat: {model: m, replicas: [{url: "BACKEND"}]}
deployments:
  emb: {model: minilm, tasks: [embed], managed: {backend: sim}}
store: {backend: sqlite, path: "DB"}
entries:
  assistant:
    default: [chat]
    plugins: [{type: semantic_cache, embedder: emb}]
  team:
    default: [chat]
    plugins: [{type: semantic_cache, embedder: emb, shared: true}]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("cache"), CONFIG)
    try:
        yield fleet
    finally:
        fleet.stop()


def _chat(client: openai.OpenAI, text: str, model: str = "assistant", **extra: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], **extra)


def test_a_repeat_is_a_hit_the_backend_never_sees(fleet: Fleet) -> None:
    client = fleet.openai()
    calls, stored, hits = fleet.calls(), fleet.stored(), fleet.outcome("hit_exact")
    first = _chat(client, "How do I reset my password?")
    assert first.headers["x-router-cache"] == "miss"
    answer = first.parse()
    fleet.wait_stored(stored + 1)
    again = _chat(client, "How do I reset my password?")
    assert again.headers["x-router-cache"] == "hit" and again.headers["x-router-cache-match"] == "exact"
    hit = again.parse()
    assert hit.choices[0].message.content == answer.choices[0].message.content == REPLY
    assert hit.id != answer.id and hit.id.startswith("chatcmpl-")
    assert "cache" not in again.http_response.text  # the body never says so
    assert fleet.calls() == calls + 1
    assert fleet.outcome("hit_exact") == hits + 1
    # What asks for logprobs is neither served nor stored.
    skipped = _chat(client, "How do I reset my password?", logprobs=True)
    assert skipped.headers["x-router-cache"] == "skip" and fleet.calls() == calls + 2


def test_hits_are_replayed_as_well_formed_streams(fleet: Fleet) -> None:
    client, claude = fleet.openai(), fleet.anthropic()
    stored = fleet.stored()
    _chat(client, "Where is the reset link?").parse()
    client.responses.create(model="assistant", input="Where is the reset form?")
    claude.messages.create(model="assistant", max_tokens=64, messages=[{"role": "user", "content": "Reset how?"}])
    fleet.wait_stored(stored + 3)
    calls = fleet.calls()

    raw = _chat(client, "Where is the reset link?", stream=True, stream_options={"include_usage": True})
    assert raw.headers["x-router-cache"] == "hit"
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    raw = client.responses.with_raw_response.create(model="assistant", input="Where is the reset form?", stream=True)
    assert raw.headers["x-router-cache"] == "hit"
    events = list(raw.parse())
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert events[-1].response.output_text == REPLY

    raw = claude.messages.with_raw_response.create(model="assistant", max_tokens=64, stream=True,
                                                   messages=[{"role": "user", "content": "Reset how?"}])
    assert raw.headers["x-router-cache"] == "hit"
    kinds = [e.type for e in raw.parse()]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    with claude.messages.stream(model="assistant", max_tokens=64,
                                messages=[{"role": "user", "content": "Reset how?"}]) as stream:
        message = stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"
    assert fleet.calls() == calls


def test_a_streamed_miss_is_stored_then_hit(fleet: Fleet) -> None:
    client, claude = fleet.openai(), fleet.anthropic()
    stored, calls = fleet.stored(), fleet.calls()
    raw = _chat(client, "Can I reset it by phone?", stream=True, stream_options={"include_usage": True})
    assert raw.headers["x-router-cache"] == "miss"
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) == REPLY
    with client.responses.stream(model="assistant", input="Can I reset it by mail?") as events:
        assert events.get_final_response().output_text == REPLY
    with claude.messages.stream(model="assistant", max_tokens=64,
                                messages=[{"role": "user", "content": "Can I reset it by fax?"}]) as stream:
        assert stream.get_final_message().content[0].text == REPLY  # type: ignore[union-attr]
    fleet.wait_stored(stored + 3)
    assert fleet.calls() == calls + 3

    whole = _chat(client, "Can I reset it by phone?")
    assert whole.headers["x-router-cache"] == "hit"
    completion = whole.parse()
    assert completion.choices[0].message.content == REPLY and completion.usage is not None
    with client.responses.stream(model="assistant", input="Can I reset it by mail?") as events:
        assert events.get_final_response().output_text == REPLY
    hit = claude.messages.with_raw_response.create(model="assistant", max_tokens=64,
                                                   messages=[{"role": "user", "content": "Can I reset it by fax?"}])
    assert hit.headers["x-router-cache"] == "hit"
    assert hit.parse().content[0].text == REPLY  # type: ignore[union-attr]
    assert fleet.calls() == calls + 3


def test_a_cut_off_answer_is_not_stored(fleet: Fleet) -> None:
    client = fleet.openai()
    stored, calls = fleet.stored(), fleet.calls()
    fleet.backend.configure(finish_reason="length")
    try:
        assert _chat(client, "Tell me everything about passwords.").parse().choices[0].finish_reason == "length"
        streamed = _chat(client, "Tell me everything about usernames.", stream=True)
        assert [c.choices[0].finish_reason for c in streamed.parse() if c.choices][-1] == "length"
    finally:
        fleet.backend.configure(finish_reason="stop")
    # One that ends normally after them: once it is stored, their response hooks have run too.
    _chat(client, "And about passkeys?").parse()
    fleet.wait_stored(stored + 1)
    again = _chat(client, "Tell me everything about passwords.")
    assert again.headers["x-router-cache"] == "miss" and again.parse().choices[0].finish_reason == "stop"
    assert fleet.calls() == calls + 4


def test_api_keys_and_users_are_isolated(fleet: Fleet) -> None:
    a, b = fleet.openai(KEY_A), fleet.openai(KEY_B)
    stored, calls = fleet.stored(), fleet.calls()
    _chat(a, "What is my account number?").parse()
    fleet.wait_stored(stored + 1)
    assert _chat(b, "What is my account number?").headers["x-router-cache"] == "miss"
    assert _chat(a, "What is my account number?", user="alice").headers["x-router-cache"] == "miss"
    fleet.wait_stored(stored + 3)
    assert _chat(a, "What is my account number?", user="alice").headers["x-router-cache"] == "hit"
    assert _chat(a, "What is my account number?", user="bob").headers["x-router-cache"] == "miss"
    fleet.wait_stored(stored + 4)
    bob = _chat(a, "What is my account number?", extra_headers={"x-router-user": "bob"})
    assert bob.headers["x-router-cache"] == "hit"  # the header names the same user as the body did
    assert _chat(b, "What is my account number?").headers["x-router-cache"] == "hit"  # b's own, stored above
    assert fleet.calls() == calls + 4


def test_a_shared_cache_is_shared_across_keys(fleet: Fleet) -> None:
    stored, calls = fleet.stored(), fleet.calls()
    _chat(fleet.openai(KEY_A), "What are the office hours?", model="team", user="alice").parse()
    fleet.wait_stored(stored + 1)
    hit = _chat(fleet.openai(KEY_B), "What are the office hours?", model="team")
    assert hit.headers["x-router-cache"] == "hit"
    assert fleet.calls() == calls + 1
    assert fleet.outcome("hit_exact", entry="team") == 1


def test_a_restart_keeps_the_cache(fleet: Fleet) -> None:
    """Last in the module: it starts the router again."""
    client = fleet.openai()
    stored = fleet.stored()
    _chat(client, "Is the cache kept on disk?").parse()
    fleet.wait_stored(stored + 1)
    fleet.restart()
    calls = fleet.calls()
    hit = _chat(fleet.openai(), "Is the cache kept on disk?")
    assert hit.headers["x-router-cache"] == "hit" and hit.parse().choices[0].message.content == REPLY
    assert _chat(fleet.openai(), "How do I reset my password?").headers["x-router-cache"] == "hit"
    assert fleet.calls() == calls
