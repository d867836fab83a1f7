"""Signals answered by a model (embedding, classifier, domain, rerank), evaluated for one request on the
router's event loop: one call per deployment and kind of call, all started at once and awaited together
within the entry's signal budget, the in-process embedder in a thread beside them. A call that fails or
runs past the budget makes the signals that needed it unknown, with the reason: it never fails the request.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np

from services.router.config import (
    ClassifierSignal,
    DomainSignal,
    EmbeddingSignal,
    ModelSignal,
    RerankSignal,
    uses_local_embedder,
)
from services.router.decision.signals import SignalResult, short, unknown
from services.router.runtime.models import Classified, DecisionModels, ModelUnavailable, Reranked

log = logging.getLogger("router.signals")
T = TypeVar("T")

LOCAL = "in-process"  # the worker named for the router's own embedder
# Examples are embedded once per deployment and kept; the call is shared by the requests that wait for
# it and outlives their budgets, so that a slow first embedding still serves the requests after it.
EXAMPLES_TIMEOUT_S = 30.0
CallKey = tuple[str, str]  # (task, deployment)
LOCAL_KEY: CallKey = ("local", "")  # the in-process embedder's
# In-process embeddings running at once, late ones included: a thread past the budget is abandoned, not
# stopped, so the cap is what keeps abandoned threads from piling up on the router's CPU under load.
LOCAL_THREADS = 2


class LocalEmbedder(Protocol):
    """What signals need of services.router.decision.embedding.Embedder (all-MiniLM-L6-v2 in numpy)."""

    def embed(self, texts: list[str]) -> list[list[float]]: ...

    def best_match(self, vector: list[float], phrases: tuple[str, ...]) -> tuple[float, int]: ...

    def phrases(self, phrases: tuple[str, ...]) -> Any: ...


class ModelSignals:
    def __init__(self, models: DecisionModels | None, embedder: LocalEmbedder | None = None,
                 local_threads: int = LOCAL_THREADS) -> None:
        self.models = models  # None: no model runtime, every deployment-backed signal is unknown
        self.embedder = embedder
        # Its own threads, so a late embedding neither queues behind nor delays other work in the loop's
        # default executor (which asyncio.run also waits for at exit); the semaphore keeps it from queuing.
        self._local_threads = local_threads
        self._local_slots = threading.BoundedSemaphore(local_threads)
        self._local_pool = ThreadPoolExecutor(local_threads, thread_name_prefix="router-embed")
        self._examples: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}  # unit rows, by deployment and texts
        self._embedding: dict[tuple[str, tuple[str, ...]], asyncio.Task[np.ndarray]] = {}

    async def evaluate(self, signals: list[ModelSignal], text: str, budget_s: float) -> dict[str, SignalResult]:
        """Each signal's result, by name; those not answered within `budget_s` are unknown."""
        calls = self._start(signals, text, budget_s)
        examples = {key: self._example_vectors(*key) for key in _example_sets(signals)} if self.models else {}
        waiting = list(calls.values()) + [t for t in examples.values() if isinstance(t, asyncio.Task)]
        try:
            if waiting:
                await asyncio.wait(waiting, timeout=budget_s)
        finally:
            # Past the budget, or the request is gone: the calls are not wanted. A local embedding already
            # running finishes in its thread unawaited, holding its slot until then.
            for task in calls.values():
                task.cancel()
        return {s.name: self._result(s, calls, examples, budget_s) for s in signals}

    async def warm(self, signals: list[ModelSignal]) -> list[str]:
        """Every signal's examples embedded ahead of the first request; what failed, one line each
        (those are embedded again on first use)."""
        local = [s for s in signals if uses_local_embedder(s)]
        if local and self.embedder is not None:
            embedder = self.embedder
            await asyncio.to_thread(lambda: [embedder.phrases(texts) for s in local for texts in _texts(s)])
        tasks = [t for key in _example_sets(signals) if self.models
                 and isinstance(t := self._example_vectors(*key), asyncio.Task)]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [str(e) for e in done if isinstance(e, BaseException)]

    # ---- the calls ----

    def _start(self, signals: list[ModelSignal], text: str, budget_s: float) -> dict[CallKey, asyncio.Task[Any]]:
        loop = asyncio.get_running_loop()
        calls: dict[CallKey, asyncio.Task[Any]] = {}
        local = [s for s in signals if uses_local_embedder(s)]
        if local and self.embedder is not None:
            calls[LOCAL_KEY] = loop.create_task(self._in_process(local, text))
        models = self.models
        if models is None:
            return calls
        documents: dict[str, list[str]] = {}
        for s in signals:
            if isinstance(s, RerankSignal):
                documents.setdefault(s.deployment, []).extend(s.examples)
        for s in signals:
            if uses_local_embedder(s) or (key := _key(s)) in calls:
                continue
            deployment = key[1]
            if key[0] == "embed":
                call: Awaitable[Any] = models.embed(deployment, [text], timeout_s=budget_s)
            elif key[0] == "classify":
                call = models.classify(deployment, [text], timeout_s=budget_s)
            else:  # one rerank call per deployment, over the documents of all its signals
                call = _scored(list(dict.fromkeys(documents[deployment])), models, deployment, text, budget_s)
            calls[key] = loop.create_task(_guarded(call, deployment))
        return calls

    async def _in_process(self, signals: list[ModelSignal], text: str) -> dict[str, SignalResult]:
        """The local signals' results from a thread of the embedder's own, or ModelUnavailable at once when
        every thread is taken (busy means late: waiting for a slot would spend the budget queuing)."""
        assert self.embedder is not None
        if not self._local_slots.acquire(blocking=False):
            raise ModelUnavailable(f"in-process embedder busy: {self._local_threads} embeddings running")
        try:
            future: Future[dict[str, SignalResult]] = self._local_pool.submit(_local, self.embedder, signals, text)
        except BaseException:
            self._local_slots.release()
            raise
        # Released when the thread ends (or the call is cancelled before it started), not when the request
        # stops waiting for it.
        future.add_done_callback(lambda _: self._local_slots.release())
        return await asyncio.wrap_future(future)

    def _example_vectors(self, deployment: str, texts: tuple[str, ...]) -> np.ndarray | asyncio.Task[np.ndarray]:
        """The examples' unit vectors, or the shared call that is embedding them."""
        key = (deployment, texts)
        if key in self._examples:
            return self._examples[key]
        loop = asyncio.get_running_loop()
        task = self._embedding.get(key)
        if task is None or task.get_loop() is not loop:
            task = loop.create_task(self._embed_examples(key))
            # Read its failure even when no request is left waiting (it was logged where it happened).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._embedding[key] = task
        return task

    async def _embed_examples(self, key: tuple[str, tuple[str, ...]]) -> np.ndarray:
        assert self.models is not None  # only asked for with a runtime
        deployment, texts = key
        try:
            answer = await _guarded(self.models.embed(deployment, list(texts), timeout_s=EXAMPLES_TIMEOUT_S),
                                    deployment)
            self._examples[key] = _unit_rows(answer.vectors, len(texts), answer.worker)
            return self._examples[key]
        finally:
            self._embedding.pop(key, None)

    # ---- the answers ----

    def _result(self, s: ModelSignal, calls: dict[CallKey, asyncio.Task[Any]],
                examples: dict[tuple[str, tuple[str, ...]], Any], budget_s: float) -> SignalResult:
        if uses_local_embedder(s):
            local, reason = _outcome(calls.get(LOCAL_KEY), budget_s, "the in-process embedding model is not loaded")
            return unknown(s.type, reason) if reason else local[s.name]
        key = _key(s)
        answer, reason = _outcome(calls.get(key), budget_s, f"no model runtime serves deployment {key[1]!r}")
        if reason:
            return unknown(s.type, reason)
        try:
            if isinstance(s, ClassifierSignal) or (isinstance(s, DomainSignal) and not s.examples):
                return _classified(s, answer)
            if isinstance(s, RerankSignal):
                return _reranked(s, *answer)
            flat = tuple(t for texts in _texts(s) for t in texts)
            rows, reason = _outcome(examples.get((key[1], flat)), budget_s, "examples not embedded")
            if reason:
                return unknown(s.type, f"embedding the examples: {reason}")
            vector = _unit_rows(answer.vectors, 1, answer.worker)[0]
            if rows.shape[1] != vector.shape[0]:
                raise ModelUnavailable(f"{answer.worker} gave {vector.shape[0]} dimensions, the examples "
                                       f"{rows.shape[1]}")
            return _similar(s, rows @ vector, answer.worker, answer.latency_s)
        except ModelUnavailable as exc:  # an answer of the wrong shape
            return unknown(s.type, str(exc))


async def _guarded(call: Awaitable[T], deployment: str) -> T:
    """The call, with every failure a ModelUnavailable that says why (logged here when unexpected)."""
    try:
        return await call
    except ModelUnavailable:
        raise
    except TimeoutError:
        raise ModelUnavailable(f"deployment {deployment!r}: timed out") from None
    except KeyError:
        raise ModelUnavailable(f"deployment {deployment!r} is not in the model runtime") from None
    except Exception as exc:  # a bug here or in the runtime: the signal is unknown, the request goes on
        log.exception("deployment %r: the call failed", deployment)
        raise ModelUnavailable(f"deployment {deployment!r}: {type(exc).__name__}: {exc}") from exc


async def _scored(documents: list[str], models: DecisionModels, deployment: str, text: str,
                  budget_s: float) -> tuple[list[str], Reranked]:
    """A rerank call's answer, with the documents it scored (several signals share the call)."""
    return documents, await models.rerank(deployment, text, documents, timeout_s=budget_s)


def _outcome(task: asyncio.Task[Any] | np.ndarray | None, budget_s: float, missing: str) -> tuple[Any, str]:
    """(value, "") or (None, why there is none)."""
    if task is None:
        return None, missing
    if not isinstance(task, asyncio.Task):
        return task, ""
    if not task.done() or task.cancelled():
        return None, f"no answer within the signal budget ({budget_s:g} s)"
    exc = task.exception()
    if exc is not None:
        return None, str(exc)
    return task.result(), ""


def _key(s: ModelSignal) -> CallKey:
    assert s.deployment is not None  # local ones are called apart
    return (s.task, s.deployment)


def _texts(s: ModelSignal) -> Iterator[tuple[str, ...]]:
    """The example sets a similarity signal compares with: one, or one per domain label."""
    if isinstance(s, EmbeddingSignal):
        yield s.examples
    elif isinstance(s, DomainSignal):
        yield from (texts for _, texts in s.examples)


def _example_sets(signals: list[ModelSignal]) -> dict[tuple[str, tuple[str, ...]], None]:
    """(deployment, every example text) of each deployment-backed similarity signal, in order."""
    return {(s.deployment, tuple(t for texts in _texts(s) for t in texts)): None for s in signals
            if s.deployment is not None and isinstance(s, (EmbeddingSignal, DomainSignal)) and s.task == "embed"}


def _unit_rows(vectors: list[list[float]], count: int, worker: str) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != count or not np.isfinite(matrix).all():
        raise ModelUnavailable(f"{worker} answered {len(vectors)} vectors of shape {matrix.shape[1:]}, "
                               f"expected {count} finite ones")
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def _local(embedder: LocalEmbedder, signals: list[ModelSignal], text: str) -> dict[str, SignalResult]:
    """In a worker thread: the text embedded once, each local signal scored against its examples."""
    start = time.perf_counter()
    vector = embedder.embed([text])[0]
    scores = {s.name: [embedder.best_match(vector, texts) for texts in _texts(s)] for s in signals}
    latency = time.perf_counter() - start
    out = {}
    for s in signals:
        flat = np.full(sum(len(t) for t in _texts(s)), -np.inf, dtype=np.float32)
        offset = 0
        for texts, (score, best) in zip(_texts(s), scores[s.name], strict=True):
            flat[offset + best] = score  # only each set's best counts
            offset += len(texts)
        out[s.name] = _similar(s, flat, LOCAL, latency)
    return out


def _similar(s: ModelSignal, similarities: np.ndarray, worker: str, latency_s: float) -> SignalResult:
    """An embedding signal (the closest example) or a domain signal by examples (the closest example's label)."""
    best = int(np.argmax(similarities))
    score = float(similarities[best])
    labels = [label for label, texts in s.examples for _ in texts] if isinstance(s, DomainSignal) else []
    flat = [t for texts in _texts(s) for t in texts]
    if isinstance(s, DomainSignal):
        domain = labels[best]
        matched = domain in s.domains and score >= s.threshold
        detail = _domain_detail(s, domain, f"similarity {score:.2f} to {short(flat[best])}", score, matched)
        return SignalResult(s.type, matched, detail, score, worker, latency_s, label=domain)
    assert isinstance(s, EmbeddingSignal)
    matched = score >= s.threshold
    detail = f"similarity {score:.2f} to {short(flat[best])} {'>=' if matched else '<'} {s.threshold:.2f}"
    return SignalResult(s.type, matched, detail, score, worker, latency_s)


def _classified(s: ClassifierSignal | DomainSignal, answer: Classified) -> SignalResult:
    if len(answer.results) != 1:
        raise ModelUnavailable(f"{answer.worker} answered {len(answer.results)} results for 1 text")
    top = answer.results[0]
    wanted = s.labels if isinstance(s, ClassifierSignal) else s.domains
    matched = top.label in wanted and top.probability >= s.threshold
    if isinstance(s, DomainSignal):
        detail = _domain_detail(s, top.label, f"p={top.probability:.2f}", top.probability, matched)
        return SignalResult(s.type, matched, detail, top.probability, answer.worker, answer.latency_s, label=top.label)
    # Unmatched, the score still says how close the text came: the best probability among the labels.
    score = top.probability if top.label in wanted else max(top.probs.get(label, 0.0) for label in wanted)
    where = "in" if top.label in wanted else "not in"
    detail = f"top label {top.label!r} (p={top.probability:.2f}) {where} [{', '.join(wanted)}]"
    if top.label in wanted:
        detail += f", {'>=' if matched else '<'} {s.threshold:.2f}"
    return SignalResult(s.type, matched, detail, score, answer.worker, answer.latency_s, label=top.label)


def _domain_detail(s: DomainSignal, domain: str, how: str, score: float, matched: bool) -> str:
    if domain not in s.domains:
        return f"domain {domain!r} ({how}) not in [{', '.join(s.domains)}]"
    return f"domain {domain!r} ({how}) {'>=' if matched else '<'} {s.threshold:.2f}"


def _reranked(s: RerankSignal, documents: list[str], answer: Reranked) -> SignalResult:
    """`documents`: what the call scored, the examples of every rerank signal on this deployment."""
    if len(answer.scores) != len(documents) or not np.isfinite(answer.scores).all():
        raise ModelUnavailable(f"{answer.worker} answered {len(answer.scores)} scores for {len(documents)} "
                               "documents, or not all finite")
    at = {document: i for i, document in enumerate(documents)}
    scores = [answer.scores[at[example]] for example in s.examples]
    best = max(range(len(scores)), key=scores.__getitem__)
    score, matched = float(scores[best]), scores[best] >= s.threshold
    detail = f"relevance {score:.2f} to {short(s.examples[best])} {'>=' if matched else '<'} {s.threshold:.2f}"
    return SignalResult(s.type, matched, detail, score, answer.worker, answer.latency_s)
