"""A knowledge base kept indexed in the store (router process): its files walked, chunked, embedded and
stored by a background task, at start (once its embedder answers) and every `refresh_s`, incrementally
by content hash. Idempotent, so that several routers sharing one PostgreSQL may index the same base."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field

import msgspec

from services.router.config.plugins import KnowledgeConfig
from services.router.plugins.chunker import chunks
from services.router.plugins.store.base import Item, Store, StoreUnavailable
from services.router.runtime.models import DecisionModels, ModelUnavailable

log = logging.getLogger("router")
_json = msgspec.json.Encoder()

EMBED_BATCH = 32  # texts per embed call
EMBED_TIMEOUT_S = 60.0  # one batch's longest (the deployment's own timeout_s caps it)
BACKOFF_S = (0.5, 30.0)  # the embedder or the store not answering: retried after this, doubling up to the cap
LIST_PAGE = 1000  # stored file records read per store call
# Why a file is not indexed, in classes (the metrics' `reason`): over max_file_bytes, not text, not read
# this pass (what was indexed of it stays), or refused by the store (a path too long for a key).
SKIP_CLASSES = ("too_big", "binary", "unreadable", "other")


class FileRecord(msgspec.Struct):
    """Kind "file", key = the path: what was indexed of it. sha256 "" marks an update in progress: the
    file's chunks are then rewritten whatever its hash, up to `chunks` (the larger count of the two)."""
    sha256: str
    chunks: int


class Chunk(msgspec.Struct):
    """Kind "chunk", key = path#ordinal."""
    path: str
    ordinal: int
    text: str


@dataclass(frozen=True, slots=True)
class _Seen:
    """A file as the walk found it (path: as the config names it, joined with its place in a folder)."""
    path: str
    location: str  # where it is read from
    size: int
    mtime_ns: int


@dataclass(slots=True)
class Report:
    """One pass over the files."""
    indexed: list[str] = field(default_factory=list)  # new or changed: embedded and stored
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)  # gone (or no longer indexable): their chunks deleted
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why it is not indexed
    classes: dict[str, str] = field(default_factory=dict)  # path -> its skip's class (SKIP_CLASSES)
    written: dict[str, int] = field(default_factory=dict)  # path -> chunks, of the files indexed
    chunks: int = 0  # chunks embedded


class KnowledgeBase:
    """One base, shared by every rag plugin that recalls from it (start/stop are counted)."""

    def __init__(self, config: KnowledgeConfig, store: Store, models: DecisionModels) -> None:
        self.config = config
        self.store = store
        self.models = models
        self.skipped: dict[str, str] = {}  # as of the last pass: path -> why it is not indexed
        self.skips = 0  # files found not indexable: one log line each (a file is counted again once it changes)
        self.passes = 0  # passes completed
        # As of the last pass (the metrics read them): files and chunks in the store, skips by class.
        self.files = 0
        self.chunks = 0  # a file whose update was cut short counts the larger of its two versions' chunks
        self.skip_counts: dict[str, int] = dict.fromkeys(SKIP_CLASSES, 0)
        self.indexed = asyncio.Event()  # set once the first pass completed
        self._logged: dict[str, tuple[str, int, int]] = {}  # path -> the skip last logged (reason, size, mtime)
        self._warned: set[str] = set()  # paths the walk could not read, said once each (until they can be)
        self._hashes: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime_ns, sha256) last read
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._users = 0

    async def start(self) -> None:
        """The background indexing started (by the first user; later ones share it)."""
        self._users += 1
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"knowledge {self.config.name}")

    async def stop(self) -> None:
        """Stopped when its last user stops: a pass in progress is abandoned (the next start completes it)."""
        self._users = max(0, self._users - 1)
        if self._users or self._task is None:
            return
        self._stop.set()
        task, self._task = self._task, None
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        delay = BACKOFF_S[0]
        failing = False
        while True:
            try:
                report = await self.refresh()
            except (ModelUnavailable, StoreUnavailable) as exc:
                if not failing:  # one line per outage, not one per retry
                    log.warning("knowledge base %s: indexing waits for its embedder and store, retrying "
                                "(backing off up to %ss): %s", self.config.name, BACKOFF_S[1], exc)
                failing = True
            except Exception:  # a bug must not end the indexing silently: said, then retried
                log.exception("knowledge base %s: indexing pass failed", self.config.name)
                failing = True
            else:
                if failing or report.indexed or report.removed or self.passes == 1:  # the first: said whatever it did
                    log.info("knowledge base %s: %d files indexed (%d chunks), %d unchanged, %d removed, "
                             "%d skipped", self.config.name, len(report.indexed), report.chunks,
                             report.unchanged, len(report.removed), len(report.skipped))
                failing, delay = False, BACKOFF_S[0]
                if self.config.refresh_s == 0:
                    return
            if await self._stopped(delay if failing else self.config.refresh_s):
                return
            if failing:
                delay = min(delay * 2, BACKOFF_S[1])

    async def _stopped(self, wait_s: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    async def refresh(self) -> Report:
        """One pass: new and changed files indexed, removed ones deleted. ModelUnavailable or
        StoreUnavailable end it early; what was done stays done, the rest is done by the next pass."""
        async with self._lock:
            report = Report()
            found, too_big, unreadable = await asyncio.to_thread(self._walk)
            stored = await self._stored()
            for seen in too_big:
                self._skip(report, seen, self._too_big(seen.size), "too_big")
            for seen in found.values():
                if not await self._file(seen, stored.get(seen.path), report):
                    unreadable.add(seen.path)
            # A file not read this time keeps what was indexed of it; one now too big or binary does not.
            keep = (set(found) - set(report.skipped)) | unreadable
            for path, record in stored.items():
                if path not in keep:
                    await self._remove(path, record.chunks)
                    report.removed.append(path)
            self.skipped = report.skipped
            kept = {path: record.chunks for path, record in stored.items() if path in keep}
            kept.update(report.written)
            self.files, self.chunks = len(kept), sum(kept.values())
            self.skip_counts = dict.fromkeys(SKIP_CLASSES, 0)
            for kind in report.classes.values():
                self.skip_counts[kind] += 1
            self.skip_counts["unreadable"] = len(unreadable)
            self.passes += 1
            self.indexed.set()
            return report

    def _too_big(self, size: int) -> str:
        return f"{size} bytes, over max_file_bytes ({self.config.max_file_bytes})"

    def _walk(self) -> tuple[dict[str, _Seen], list[_Seen], set[str]]:
        """The files under the configured paths (a folder's: those with one of `extensions`; a file named
        in paths is read whatever its name), those too big to read, and those that could not be stat'ed.
        In a thread: it stats every file."""
        found: dict[str, _Seen] = {}
        too_big: list[_Seen] = []
        unreadable: set[str] = set()
        extensions = tuple(e.lower() for e in self.config.extensions)

        def add(path: str, location: str) -> None:
            try:
                stat = os.stat(location)
            except OSError as exc:
                unreadable.add(path)
                self._warn(path, f"{path} not read: {exc}")
                return
            seen = _Seen(path, location, stat.st_size, stat.st_mtime_ns)
            if stat.st_size > self.config.max_file_bytes:
                too_big.append(seen)
            else:
                found[path] = seen

        for configured in self.config.paths:
            root = os.path.normpath(configured)
            if not os.path.isfile(root) and not os.path.isdir(root):
                self._warn(configured, f"path {configured} is neither a file nor a folder")
                continue
            self._warned.discard(configured)
            if os.path.isfile(root):
                add(root.replace(os.sep, "/"), root)
                continue
            for folder, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    if name.lower().endswith(extensions):
                        location = os.path.join(folder, name)
                        add(location.replace(os.sep, "/"), location)
        return found, too_big, unreadable

    async def _stored(self) -> dict[str, FileRecord]:
        """The files the store says are indexed in this base (by this router or another)."""
        records: dict[str, FileRecord] = {}
        offset = 0
        while True:
            page = await self.store.items("file", self.config.name, LIST_PAGE, offset)
            for item in page:
                try:
                    records[item.key] = msgspec.json.decode(item.payload, type=FileRecord)
                except msgspec.DecodeError:
                    records[item.key] = FileRecord("", 0)  # unreadable: rewritten (its chunks: those it finds)
            if len(page) < LIST_PAGE:
                return records
            offset += LIST_PAGE

    async def _file(self, seen: _Seen, record: FileRecord | None, report: Report) -> bool:
        """One file brought up to date; False when it could not be read (what was indexed of it stays)."""
        known = self._hashes.get(seen.path)
        if record is not None and record.sha256 and known is not None and known[:2] == (seen.size, seen.mtime_ns) \
                and known[2] == record.sha256:
            report.unchanged += 1  # not read again: neither its size nor its mtime changed
            return True
        try:
            read = await asyncio.to_thread(_read, seen.location, self.config.max_file_bytes)
        except OSError as exc:
            self._warn(seen.path, f"{seen.path} not read: {exc}")
            return False
        self._warned.discard(seen.path)
        if isinstance(read, str):  # why it is not text ("": it grew too big since the walk)
            if read:
                self._skip(report, seen, read, "binary")
            else:
                self._skip(report, seen, self._too_big(seen.size), "too_big")
            return True
        text, sha = read
        self._hashes[seen.path] = (seen.size, seen.mtime_ns, sha)
        if record is not None and record.sha256 == sha:
            report.unchanged += 1
            return True
        pieces = await asyncio.to_thread(chunks, text, self.config.chunk_chars, self.config.overlap_chars)
        vectors = await self._embed(pieces)
        try:
            await self._write(seen.path, pieces, vectors, sha, record.chunks if record is not None else 0)
        except ValueError as exc:  # the store refused a key (a path too long for it)
            self._skip(report, seen, str(exc), "other")
            return True
        report.indexed.append(seen.path)
        report.written[seen.path] = len(pieces)
        report.chunks += len(pieces)
        return True

    async def _embed(self, pieces: list[str]) -> list[tuple[float, ...]]:
        vectors: list[tuple[float, ...]] = []
        for i in range(0, len(pieces), EMBED_BATCH):
            embedded = await self.models.embed(self.config.embedder, pieces[i:i + EMBED_BATCH],
                                               timeout_s=EMBED_TIMEOUT_S, truncate=True)
            vectors.extend(tuple(v) for v in embedded.vectors)
        return vectors

    async def _write(self, path: str, pieces: list[str], vectors: list[tuple[float, ...]], sha: str,
                     before: int) -> None:
        """The file's chunks replaced: marked in progress first, so that a pass cut short (a crash, a
        store outage, another router's pass) leaves a record that makes the next pass redo it whole."""
        base, now = self.config.name, time.time()
        await self.store.put(Item("file", base, path, _json.encode(FileRecord("", max(before, len(pieces)))),
                                  created=now))
        for ordinal, (text, vector) in enumerate(zip(pieces, vectors, strict=True)):
            await self.store.put(Item("chunk", base, f"{path}#{ordinal}",
                                      _json.encode(Chunk(path, ordinal, text)), vector, created=now))
        for ordinal in range(len(pieces), before):
            await self.store.delete("chunk", base, f"{path}#{ordinal}")
        await self.store.put(Item("file", base, path, _json.encode(FileRecord(sha, len(pieces))), created=now))

    async def _remove(self, path: str, count: int) -> None:
        for ordinal in range(count):
            await self.store.delete("chunk", self.config.name, f"{path}#{ordinal}")
        await self.store.delete("file", self.config.name, path)
        self._hashes.pop(path, None)

    def _warn(self, key: str, message: str) -> None:
        """Said once, not every pass, until what it is about is fine again."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning("knowledge base %s: %s", self.config.name, message)

    def _skip(self, report: Report, seen: _Seen, reason: str, kind: str) -> None:
        """Not indexed, and said so once (again only when the file changes). `kind`: one of SKIP_CLASSES."""
        report.skipped[seen.path] = reason
        report.classes[seen.path] = kind
        said = (reason, seen.size, seen.mtime_ns)
        if self._logged.get(seen.path) != said:
            self._logged[seen.path] = said
            self.skips += 1
            log.warning("knowledge base %s: %s skipped: %s", self.config.name, seen.path, reason)


def _read(location: str, limit: int) -> tuple[str, str] | str:
    """The file's text and sha256, or why it is not text (a NUL byte, or not UTF-8), or "" when it grew
    past `limit` bytes since it was found."""
    with open(location, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        return ""
    if b"\0" in data:
        return "binary (it holds NUL bytes)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"binary (not UTF-8: {exc.reason} at byte {exc.start})"
    return text, hashlib.sha256(data).hexdigest()

