"""Stateful Responses through a real router process (its store a SQLite file in tmp) in front of the
OpenAI-compatible test backend, driven by the official openai SDK: create and chain with
previous_response_id, streamed and not (the backend receives the earlier turns), retrieve, delete,
input_items; another API key can neither read nor chain; store=False keeps nothing; a restart keeps all."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.procs import HttpProc, free_port_block, start_router

KEY, OTHER_KEY = "k-one", "k-two"


def _config(backend: HttpProc, db: Path) -> str:
    return f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}, {OTHER_KEY}]}}]
store: {{backend: sqlite, path: {db}}}
pools:
  p:
    model: m
    replicas: [{{url: {backend.url}}}]
entries:
  fleet: {{default: [p]}}
"""


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def router(backend: HttpProc, state_dir: Path) -> Iterator[HttpProc]:
    proc = start_router(state_dir, _config(backend, state_dir / "state.db"))
    yield proc
    proc.stop()


def _client(router: HttpProc, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=router.url + "/v1", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(router: HttpProc) -> Iterator[openai.OpenAI]:
    with _client(router) as c:
        yield c


@pytest.fixture(scope="module")
def other(router: HttpProc) -> Iterator[openai.OpenAI]:
    """A client with the listener's other API key: another tenant."""
    with _client(router, OTHER_KEY) as c:
        yield c


def _sent(backend: HttpProc) -> list[dict[str, Any]]:
    """The messages of the last request the backend received."""
    return backend.stats()["last_body"]["messages"]  # type: ignore[no-any-return]


def _streamed(client: openai.OpenAI, **kw: Any) -> Any:
    """The final response of a streamed create, after checking every event named it."""
    events = list(client.responses.create(model="fleet", stream=True, **kw))
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}
    return final


@pytest.mark.parametrize("stream", [False, True])
def test_a_chain_carries_the_earlier_turns_to_the_pool(client: openai.OpenAI, backend: HttpProc,
                                                        stream: bool) -> None:
    backend.reset()
    create = (lambda **kw: _streamed(client, **kw)) if stream else \
        (lambda **kw: client.responses.create(model="fleet", **kw))
    first = create(input="my name is Ada", instructions="be terse")
    assert first.output_text == "a:m" and first.previous_response_id is None
    # Chained at once: the response was stored before its last byte went out.
    second = create(input="what is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert _sent(backend) == [{"role": "user", "content": "my name is Ada"},
                              {"role": "assistant", "content": [{"type": "text", "text": "a:m"}]},
                              {"role": "user", "content": "what is my name?"}]  # not the first's instructions
    third = create(input="and now?", previous_response_id=second.id, instructions="be kind")
    assert [m["role"] for m in _sent(backend)] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert _sent(backend)[0] == {"role": "system", "content": "be kind"}
    back = client.responses.retrieve(third.id)
    assert back.model_dump() == third.model_dump()  # the very response the client got
    assert back.model_extra is not None and back.model_extra["store"] is True


def test_retrieve_input_items_and_delete(client: openai.OpenAI) -> None:
    first = client.responses.create(model="fleet", input="one")
    made = client.responses.create(model="fleet", previous_response_id=first.id, input=[
        {"role": "user", "content": "two"}, {"role": "assistant", "content": "three"},
        {"role": "user", "content": "four"}])
    items = client.responses.input_items.list(made.id)
    assert [(i.role, i.content[0].text) for i in items.data] == [  # type: ignore[union-attr]
        ("user", "four"), ("assistant", "three"), ("user", "two")]
    pages = client.responses.input_items.list(made.id, order="asc", limit=1)
    assert [i.content[0].text for i in pages] == ["two", "three", "four"]  # type: ignore[union-attr]
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fleet", input="five", previous_response_id=made.id)
    assert client.responses.retrieve(first.id).id == first.id  # the earlier one is its own


def test_another_api_key_can_neither_read_nor_chain(client: openai.OpenAI, other: openai.OpenAI,
                                                     backend: HttpProc) -> None:
    mine = client.responses.create(model="fleet", input="secret")
    backend.reset()
    for call in (lambda: other.responses.retrieve(mine.id), lambda: other.responses.input_items.list(mine.id),
                 lambda: other.responses.delete(mine.id),
                 lambda: other.responses.create(model="fleet", input="x", previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert mine.id in info.value.message
    assert backend.stats()["requests"] == 0  # the chain was refused before it reached the pool
    assert client.responses.retrieve(mine.id).output_text == "a:m"


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    made = client.responses.create(model="fleet", input="forget me", store=False)
    assert made.model_extra is not None and made.model_extra["store"] is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fleet", input="x", previous_response_id=made.id)


def test_a_stored_response_survives_a_restart(backend: HttpProc, tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    port = free_port_block(1, spread=0)
    router = start_router(tmp_path, _config(backend, db), port=port)
    try:
        with _client(router) as client:
            made = client.responses.create(model="fleet", input="remember")
    finally:
        router.stop()
    router = start_router(tmp_path, _config(backend, db), port=port)
    try:
        with _client(router) as client:
            assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
            client.responses.create(model="fleet", input="again", previous_response_id=made.id)
        assert _sent(backend)[0] == {"role": "user", "content": "remember"}
    finally:
        router.stop()


def test_a_conversation_carries_its_items_and_keeps_each_turn(client: openai.OpenAI, other: openai.OpenAI,
                                                               backend: HttpProc) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": "I am Ada"}],
                                               metadata={"topic": "names"})
    backend.reset()
    made = client.responses.create(model="fleet", input="who am I?", conversation=conversation.id)
    assert made.conversation is not None and made.conversation.id == conversation.id
    assert _sent(backend) == [{"role": "user", "content": [{"type": "text", "text": "I am Ada"}]},
                              {"role": "user", "content": "who am I?"}]
    items = client.conversations.items.list(conversation.id, order="asc")
    assert [i.content[0].text for i in items.data] == ["I am Ada", "who am I?", "a:m"]  # type: ignore[union-attr]
    assert items.data[-1].id == made.output[0].id
    with pytest.raises(openai.NotFoundError):
        other.conversations.retrieve(conversation.id)
    client.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fleet", input="x", conversation=conversation.id)
