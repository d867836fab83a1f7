"""A knowledge base indexed into the fake store (plugins/knowledge.py) from files in a tmp folder, and
the chunker (plugins/chunker.py): which files are read, what is stored of them, what a pass re-embeds
(only what changed), what it deletes, what it skips and says so, and how it waits for its embedder."""
from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.router.config.plugins import KnowledgeConfig
from services.router.metrics import RouterMetrics
from services.router.plugins import knowledge
from services.router.plugins.chunker import chunks
from services.router.plugins.knowledge import Chunk, FileRecord, KnowledgeBase
from services.router.plugins.store.base import Item, StoreUnavailable
from services.router.runtime.models import ModelUnavailable
from tests.support.fake_models import FakeModels
from tests.support.fake_store import FakeStore
from tests.support.word_vectors import WordVectors, vector

T = TypeVar("T")


def run(work: Awaitable[T]) -> T:
    return asyncio.run(work)  # type: ignore[arg-type]


def base(paths: list[Path], store: FakeStore | None = None, models: FakeModels | None = None,
         **settings: Any) -> KnowledgeBase:
    config = KnowledgeConfig("kb", tuple(str(p) for p in paths), "emb", **settings)
    return KnowledgeBase(config, store or FakeStore(), models or FakeModels(vectors=WordVectors()))


def stored(store: FakeStore) -> dict[str, Any]:
    """kind "chunk": key -> text; kind "file": key -> (sha256, chunks)."""
    out: dict[str, Any] = {}
    for (kind, scope, key), item in sorted(store.items_by.items()):
        assert scope == "kb"
        if kind == "chunk":
            chunk = msgspec.json.decode(item.payload, type=Chunk)
            assert key == f"{chunk.path}#{chunk.ordinal}" and item.vector == vector(chunk.text)
            out[key] = chunk.text
        else:
            record = msgspec.json.decode(item.payload, type=FileRecord)
            out[key] = (record.sha256, record.chunks)
    return out


def embedded(models: FakeModels) -> list[str]:
    return [text for kind, _, texts in models.calls if kind == "embed" for text in texts]


# ---- the chunker ----

def test_headings_start_chunks_paragraphs_are_packed_and_a_long_one_is_cut_with_overlap() -> None:
    text = ("# One\n\npara a.\n\npara b.\n\n## Two\n\n" + " ".join(f"w{i}" for i in range(60)) +
            "\n\nTitle\n=====\nunder it\n\n```\n# not a heading\n```")
    out = chunks(text, 100, 20)
    assert out[0] == "# One\n\npara a.\n\npara b."
    assert out[1].startswith("## Two\n\nw0 w1") and all(len(c) <= 100 for c in out)
    cut = out[1].split()[-1]
    assert out[2].split()[0] != "w0" and cut in out[2].split()[:5]  # the overlap carried whole words over
    assert out[-2].endswith("w59")  # the underlined title starts a section; the `#` in code does not
    assert out[-1] == "Title\n=====\nunder it\n\n```\n# not a heading\n```"
    assert chunks("", 100, 0) == [] and chunks("\n \n", 100, 0) == []
    assert chunks("\ufeffa\r\n\r\nb", 100, 0) == ["a\n\nb"]


def test_no_chunk_is_longer_than_its_size_and_no_word_is_lost() -> None:
    rng = random.Random(7)
    vocabulary = ["x", "lorem", "été", "naïve", "\U0001f469\u200d\U0001f4bb", "a" * 150, "\n\n", "# h\n", "\n"]
    for _ in range(200):
        text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 300)))
        size = rng.randint(100, 400)
        overlap = rng.randint(0, size - 1)
        out = chunks(text, size, overlap)
        assert all(0 < len(c) <= size and c == c.strip() for c in out)
        joined = " ".join(out)
        for word in set(re.findall(r"\S+", text)) - {"a" * 150}:  # a word longer than half a chunk is cut
            assert word in joined, (word, size, overlap)


def test_a_hard_cut_never_parts_a_character_from_its_marks() -> None:
    accents = "e\u0301" * 300  # no whitespace: cut where it must be, at a character's start
    out = chunks(accents, 101, 0)
    assert all(not c.startswith("\u0301") for c in out) and "".join(out) == accents
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    out = chunks(family * 60, 100, 10)
    assert all(c.startswith("\U0001f468") and c.endswith("\U0001f467") for c in out)


# ---- the index ----

def test_a_pass_indexes_a_folders_files_recursively_and_a_named_file_whatever_its_extension(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "deep" / "er").mkdir(parents=True)
    (docs / "a.md").write_text("alpha text")
    (docs / "deep" / "er" / "b.TXT").write_text("beta text")
    (docs / "c.py").write_text("print('not read')")
    (tmp_path / "named.log").write_text("named text")
    kb = base([docs, tmp_path / "named.log"])
    report = run(kb.refresh())
    assert sorted(report.indexed) == [f"{docs}/a.md", f"{docs}/deep/er/b.TXT", f"{tmp_path}/named.log"]
    index = stored(kb.store)  # type: ignore[arg-type]
    assert index[f"{docs}/a.md#0"] == "alpha text" and index[f"{docs}/deep/er/b.TXT#0"] == "beta text"
    assert index[f"{docs}/a.md"][1] == 1 and len(index[f"{docs}/a.md"][0]) == 64
    assert not any("c.py" in key for key in index) and kb.passes == 1 and kb.indexed.is_set()


def test_an_unchanged_file_is_not_embedded_again_a_changed_one_is_replaced_a_removed_one_deleted(
        tmp_path: Path) -> None:
    models = FakeModels(vectors=WordVectors())
    kb = base([tmp_path], models=models, chunk_chars=100, overlap_chars=0)
    keep, change, remove = tmp_path / "keep.md", tmp_path / "change.md", tmp_path / "remove.md"
    keep.write_text("steady words")
    change.write_text("\n\n".join(f"old paragraph {i} " + "o" * 80 for i in range(3)))
    remove.write_text("doomed words")
    run(kb.refresh())
    calls = len(embedded(models))
    assert run(kb.refresh()).unchanged == 3 and len(embedded(models)) == calls
    change.write_text("new text")
    remove.unlink()
    report = run(kb.refresh())
    assert report.indexed == [str(change)] and report.removed == [str(remove)] and report.unchanged == 1
    assert embedded(models)[calls:] == ["new text"]
    index = stored(kb.store)  # type: ignore[arg-type]
    assert {k: v for k, v in index.items() if "#" in k} == {f"{change}#0": "new text", f"{keep}#0": "steady words"}
    assert set(index) - {f"{change}#0", f"{keep}#0"} == {str(change), str(keep)}


def test_binary_and_too_big_files_are_skipped_said_once_and_counted_and_a_50_mb_document_is_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "nul.md").write_bytes(b"text\0more")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    with open(tmp_path / "huge.md", "wb") as f:  # sparse: 50 MB on disk costs nothing
        f.truncate(50 << 20)
    (tmp_path / "fine.md").write_text("fine words")
    kb = base([tmp_path])
    with caplog.at_level(logging.WARNING, logger="router"):
        report = run(kb.refresh())
        run(kb.refresh())
    assert report.indexed == [str(tmp_path / "fine.md")]
    assert kb.skipped == {str(tmp_path / "nul.md"): "binary (it holds NUL bytes)",
                          str(tmp_path / "latin1.txt"): "binary (not UTF-8: unexpected end of data at byte 3)",
                          str(tmp_path / "huge.md"): "52428800 bytes, over max_file_bytes (10485760)"}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and kb.skips == 3  # once each, not once a pass
    assert f"knowledge base kb: {tmp_path}/huge.md skipped: 52428800 bytes, over max_file_bytes" in lines[0]
    assert set(stored(kb.store)) == {f"{tmp_path}/fine.md", f"{tmp_path}/fine.md#0"}  # type: ignore[arg-type]


def test_a_file_that_turns_binary_loses_its_chunks_and_is_said_again_when_it_changes(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("readable")
    kb = base([tmp_path])
    run(kb.refresh())
    doc.write_bytes(b"\0\1\2")
    report = run(kb.refresh())
    assert report.removed == [str(doc)] and not kb.store.items_by  # type: ignore[attr-defined]
    doc.write_bytes(b"\0\1\2\3")
    run(kb.refresh())
    assert kb.skips == 2


def test_two_routers_indexing_one_base_in_one_store_agree_and_embed_each_file_once(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("shared words\n\n" + "more " * 400)
    store = FakeStore()
    first, second = FakeModels(vectors=WordVectors()), FakeModels(vectors=WordVectors())
    one = base([tmp_path], store, first, chunk_chars=500, overlap_chars=50)
    two = base([tmp_path], store, second, chunk_chars=500, overlap_chars=50)
    run(one.refresh())
    before = stored(store)
    assert run(two.refresh()).unchanged == 1 and not second.calls and stored(store) == before


def test_a_pass_cut_short_by_the_store_is_completed_by_the_next(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("\n\n".join(f"paragraph {i} " + "p" * 80 for i in range(5)))
    store = FailingAfter()
    kb = base([tmp_path], store, chunk_chars=100, overlap_chars=0)
    run(kb.refresh())
    doc.write_text("short now")
    store.puts_left = 2  # the in-progress record and one chunk, then down
    with pytest.raises(StoreUnavailable):
        run(kb.refresh())
    assert stored(store)[str(doc)] == ("", 5)  # marked in progress, the larger count kept
    store.puts_left = None
    assert run(kb.refresh()).indexed == [str(doc)]
    assert {k: v for k, v in stored(store).items() if "#" in k} == {f"{doc}#0": "short now"}


class FailingAfter(FakeStore):
    """A store that goes down after `puts_left` more puts."""

    def __init__(self) -> None:
        super().__init__()
        self.puts_left: int | None = None

    async def put(self, item: Item) -> None:
        if self.puts_left is not None:
            if self.puts_left == 0:
                raise StoreUnavailable("fake store: down mid-pass")
            self.puts_left -= 1
        await super().put(item)


def test_indexing_waits_for_its_embedder_then_refreshes_until_stopped(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knowledge, "BACKOFF_S", (0.001, 0.01))
    (tmp_path / "a.md").write_text("first")
    failures = 3

    async def not_yet(kind: str, deployment: str) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise ModelUnavailable("emb: no ready worker")

    models = FakeModels(vectors=WordVectors(), hook=not_yet)
    kb = base([tmp_path], models=models, refresh_s=0.01)

    async def go() -> list[str]:
        await kb.start()
        await asyncio.wait_for(kb.indexed.wait(), 10)
        (tmp_path / "b.md").write_text("second")

        async def second_indexed() -> None:
            while not any(k[2] == f"{tmp_path}/b.md#0" for k in kb.store.items_by):  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)

        await asyncio.wait_for(second_indexed(), 10)
        await kb.stop()
        return embedded(models)

    assert run(go()) == ["first", "first", "first", "first", "second"]  # three refusals, then each once
    assert kb._task is None


def test_a_file_that_cannot_be_read_keeps_its_chunks_and_a_missing_path_is_said_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("kept words")
    kb = base([tmp_path, tmp_path / "nowhere"])
    read = knowledge._read

    def refuse(location: str, limit: int) -> Any:
        if location == str(doc) and doc.read_text() != "kept words":
            raise PermissionError(13, "Permission denied", location)
        return read(location, limit)

    monkeypatch.setattr(knowledge, "_read", refuse)
    with caplog.at_level(logging.WARNING, logger="router"):
        run(kb.refresh())
        before = stored(kb.store)  # type: ignore[arg-type]
        doc.write_text("changed but unreadable")
        for _ in range(2):
            report = run(kb.refresh())
            assert not report.removed and not report.indexed and stored(kb.store) == before  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        f"knowledge base kb: path {tmp_path}/nowhere is neither a file nor a folder",
        f"knowledge base kb: {doc} not read: [Errno 13] Permission denied: '{doc}'"]


# ---- the metrics ----

def scraped(kb: KnowledgeBase) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The router's /metrics text over this base, parsed: (sample name, labels) -> value."""
    families = text_string_to_metric_families(RouterMetrics({}, {"kb": kb}).render().decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families if f.name.startswith("router_knowledge") for s in f.samples}


def test_the_metrics_show_files_indexed_and_skipped_by_reason_chunks_and_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "one.md").write_text("one chunk")
    (tmp_path / "three.md").write_text("\n\n".join(f"paragraph {i} " + "p" * 80 for i in range(3)))
    (tmp_path / "nul.md").write_bytes(b"\x89PNG\0\0binary")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    (tmp_path / "big.md").write_text("x" * 2000)
    (tmp_path / "locked.md").write_text("never read")
    read = knowledge._read

    def refuse(location: str, limit: int) -> Any:
        if location.endswith("locked.md"):
            raise PermissionError(13, "Permission denied", location)
        return read(location, limit)

    monkeypatch.setattr(knowledge, "_read", refuse)
    kb = base([tmp_path], chunk_chars=100, overlap_chars=0, max_file_bytes=1000)

    def reasons(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
        return {dict(labels)["reason"]: v for (name, labels), v in metrics.items()
                if name == "router_knowledge_files_skipped"}

    before = scraped(kb)
    assert before[("router_knowledge_ready", (("base", "kb"),))] == 0
    assert before[("router_knowledge_passes_total", (("base", "kb"),))] == 0
    assert before[("router_knowledge_files", (("base", "kb"),))] == 0

    run(kb.refresh())
    after = scraped(kb)
    assert after[("router_knowledge_files", (("base", "kb"),))] == 2
    assert after[("router_knowledge_chunks", (("base", "kb"),))] == 4  # one, and three paragraphs of ~90
    assert reasons(after) == {"too_big": 1, "binary": 2, "unreadable": 1, "other": 0}
    assert after[("router_knowledge_passes_total", (("base", "kb"),))] == 1
    assert after[("router_knowledge_ready", (("base", "kb"),))] == 1

    # An unchanged pass counts what is stored, not what it wrote; a removed file and a shorter one show.
    run(kb.refresh())
    (tmp_path / "one.md").unlink()
    (tmp_path / "three.md").write_text("short now")
    (tmp_path / "nul.md").write_text("text now")
    run(kb.refresh())
    last = scraped(kb)
    assert last[("router_knowledge_files", (("base", "kb"),))] == 2
    assert last[("router_knowledge_chunks", (("base", "kb"),))] == 2
    assert reasons(last) == {"too_big": 1, "binary": 1, "unreadable": 1, "other": 0}
    assert last[("router_knowledge_passes_total", (("base", "kb"),))] == 3


def test_a_second_router_counts_the_files_another_indexed(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("\n\n".join(f"paragraph {i} " + "p" * 80 for i in range(2)))
    store = FakeStore()
    run(base([tmp_path], store, chunk_chars=100, overlap_chars=0).refresh())
    other = base([tmp_path], store, chunk_chars=100, overlap_chars=0)
    assert run(other.refresh()).unchanged == 1
    assert (other.files, other.chunks) == (1, 2)
