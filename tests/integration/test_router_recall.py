"""Memory and rag through a real router process: its store a SQLite file in tmp, a knowledge base of a
tmp folder, a managed `sim` embed deployment (its vectors come from the token ids, so only equal texts
are similar: a test recalls a chunk or a memory by sending its exact text), and the OpenAI test backend
as the chat pool, which reports the body it received. Covers what upstream is given, the sources
header, GET/DELETE /v1/memory between two keys and two users, and a changed and a removed file."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from tests.support.procs import HttpProc, start_router
from tests.support.waiting import until

ONE, TWO = {"authorization": "Bearer key-one"}, {"authorization": "Bearer key-two"}
BOILER = "# Boiler\n\nThe boiler pressure must stay between one and two bar."  # one chunk: heading and paragraph
PUMP = "The pump is serviced every spring by the facilities team."
FAN = "The fan in room four rattles when it runs at full speed."

CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [key-one, key-two]}}]
pools:
  chat: {{model: tiny, replicas: [{{url: "{backend}"}}]}}
deployments:
  emb: {{model: tiny, tasks: [embed], managed: {{backend: sim}}}}
store: {{backend: sqlite, path: "{state}"}}
knowledge:
  docs: {{paths: ["{docs}"], embedder: emb, refresh_s: 0.3}}
entries:
  auto:
    default: [chat]
    plugins:
      - {{type: memory, embedder: emb, min_similarity: 0.5, timeout_s: 10}}
      - {{type: rag, knowledge: docs, min_similarity: 0.5, timeout_s: 10}}
"""


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    (folder / "ops").mkdir()
    (folder / "ops" / "boiler, main #1.md").write_text(f"{BOILER}\n")
    (folder / "pump.md").write_text(PUMP)
    (folder / "fan.md").write_text(FAN)
    (folder / "blob.md").write_bytes(b"\x89PNG\0\0binary")
    return folder


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, backend: HttpProc, docs: Path) -> Iterator[HttpProc]:
    tmp = tmp_path_factory.mktemp("router")
    proc = start_router(tmp, CONFIG.format(backend=backend.url, state=tmp / "state.db", docs=docs))
    try:
        proc.wait_ready(headers=ONE, timeout_s=240)
        yield proc
    finally:
        proc.stop()


def _chat(router: HttpProc, content: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    r = httpx.post(router.url + "/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": "auto", "messages": [{"role": "user", "content": content}], **extra})
    assert r.status_code == 200, r.text
    return r



def _sources(r: httpx.Response) -> list[str] | None:
    raw = r.headers.get("x-router-rag-sources")
    return [unquote(s) for s in raw.split(",")] if raw else None


def _memories(router: HttpProc, headers: dict[str, str], **query: Any) -> list[dict[str, Any]]:
    r = httpx.get(router.url + "/v1/memory", headers=headers, params=query, timeout=10)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def test_a_chunk_is_recalled_with_its_source_and_the_backend_gets_it_in_the_system_message(
        router: HttpProc, backend: HttpProc, docs: Path) -> None:
    r = until("the boiler chunk recalled", lambda: (lambda r: r if _sources(r) else None)(
        _chat(router, BOILER, ONE)), timeout_s=120)
    source = f"{docs}/ops/boiler, main #1.md#0"
    assert _sources(r) == [source] and "%2C" in r.headers["x-router-rag-sources"]
    system, user = backend.stats()["last_body"]["messages"]
    assert user == {"role": "user", "content": BOILER} and system["role"] == "system"
    assert f"[{source}]\n{BOILER}" in system["content"] and PUMP not in system["content"]
    assert r.json()["choices"][0]["message"]["content"]  # the answer itself is upstream's, unchanged
    assert "blob.md skipped: binary (it holds NUL bytes)" in router.log()
    skipped = 'router_knowledge_files_skipped{base="docs",reason="binary"} 1.0'  # set as the pass completes
    until("the skipped file in /metrics", lambda: skipped in httpx.get(
        router.url + "/metrics", headers=ONE, timeout=10).text or None)


def test_a_users_turn_is_remembered_recalled_for_them_only_and_listed_and_erased_by_them_only(
        router: HttpProc, backend: HttpProc) -> None:
    ann = {**ONE, "x-router-user": "ann"}
    backend.configure(reply="Noted: your cat is Miso.")
    try:
        _chat(router, "my cat is called Miso", ann, stream=True)  # a streamed answer is kept too
        [memory] = until("ann's memory", lambda: _memories(router, ONE, user="ann") or None)
    finally:
        backend.reset()
    turn = "User: my cat is called Miso\nAssistant: Noted: your cat is Miso."
    assert memory["content"] == turn and memory["object"] == "memory" and memory["id"].startswith("mem_")

    # Recalled by its own exact text (the sim's vectors), for ann only.
    _chat(router, turn, ann)
    system = backend.stats()["last_body"]["messages"][0]
    assert system["role"] == "system" and turn in system["content"]
    others = ({**ONE, "x-router-user": "bob"}, {**TWO, "x-router-user": "ann"}, ONE)
    for other in others:
        _chat(router, turn, other)
        assert [m["role"] for m in backend.stats()["last_body"]["messages"]] == ["user"], other
    # Each of those turns is kept in the background: wait for them, so that what is listed below stays put.
    until("ann's second memory", lambda: len(_memories(router, ONE, user="ann")) == 2 or None)
    for other in others:
        until("their own memory", lambda who=other: any(m["content"].startswith(f"User: {turn}")
                                                         for m in _memories(router, who)) or None)

    # Listed and erased by its owner only; another's id is an unknown one.
    others = _memories(router, TWO, user="ann") + _memories(router, ONE) + _memories(router, ONE, user="bob")
    assert others and memory["id"] not in {m["id"] for m in others}  # they have memories of their own
    for who in (TWO, {**TWO, "x-router-user": "ann"}, {**ONE, "x-router-user": "bob"}):
        gone = httpx.delete(f"{router.url}/v1/memory/{memory['id']}", headers=who, timeout=10)
        assert gone.status_code == 404 and gone.json()["error"]["message"] == \
            f"No memory found with id {memory['id']!r}."
    cleared = httpx.delete(router.url + "/v1/memory", headers={**TWO, "x-router-user": "ann"}, timeout=10).json()
    assert cleared["object"] == "list" and cleared["deleted"] >= 1
    assert memory["id"] in [m["id"] for m in _memories(router, ONE, user="ann")]  # another's erase spared it
    erased = httpx.delete(f"{router.url}/v1/memory/{memory['id']}", headers=ann, timeout=10)
    assert erased.json() == {"id": memory["id"], "object": "memory", "deleted": True}
    [probe] = _memories(router, ONE, user="ann")  # the recall above was a turn of ann's too
    assert probe["content"].startswith(f"User: {turn}\nAssistant: ")
    erased_all = httpx.delete(router.url + "/v1/memory?user=ann", headers=ONE, timeout=10).json()
    assert erased_all == {"object": "list", "deleted": 1} and _memories(router, ONE, user="ann") == []
    assert _memories(router, ONE, user="bob")  # bob's, untouched

    bad = httpx.get(router.url + "/v1/memory?limit=0", headers=ONE, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert httpx.get(router.url + "/v1/memory", timeout=10).status_code == 401


def test_a_changed_file_is_indexed_again_and_a_removed_one_is_gone(router: HttpProc, docs: Path) -> None:
    pump, fan = docs / "pump.md", docs / "fan.md"
    until("the pump chunk recalled", lambda: _sources(_chat(router, PUMP, TWO)), timeout_s=120)
    until("the fan chunk recalled", lambda: _sources(_chat(router, FAN, TWO)), timeout_s=120)
    moved = "The pump is now serviced every autumn by an outside firm."
    pump.write_text(moved)
    fan.unlink()
    assert until("the new pump text recalled", lambda: _sources(_chat(router, moved, TWO))) == [f"{pump}#0"]
    until("the old pump text forgotten", lambda: True if _sources(_chat(router, PUMP, TWO)) is None else None)
    until("the fan forgotten", lambda: True if _sources(_chat(router, FAN, TWO)) is None else None)
