"""The model runtime's calls (runtime/deployments.py) over a fake of the router's Upstream port: vLLM's
pooling API asked and read, the chat pools' scheduler choosing the worker, and every way a call cannot
be answered turned into a ModelUnavailable that says why, at once or at its deadline, never later."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from services.router.backends.pool import Pool
from services.router.config import EntryConfig, RouterConfig, parse_config
from services.router.runtime.deployments import Deployments
from services.router.runtime.models import ModelUnavailable
from services.router.server import log_start_failure
from tests.support.fake_upstream import FakeUpstream, Reply

A, B = "http://a:8000", "http://b:8000"
T = TypeVar("T")


# A signal of the kind each task serves, naming the deployment; a decision reads it, so it is needed.
_SIGNALS = {"embed": {"type": "embedding", "examples": ["x"]}, "classify": {"type": "classifier", "labels": ["x"]},
            "score": {"type": "rerank", "examples": ["x"]}, "rerank": {"type": "rerank", "examples": ["x"]}}


def _config(deployments: dict[str, Any], used: tuple[str, ...]) -> RouterConfig:
    signals = [{"name": f"s{i}", "deployment": name, **_SIGNALS[deployments[name]["tasks"][0]]}
               for i, name in enumerate(used)]
    decisions = [{"name": "d", "when": {"any": [s["name"] for s in signals]}, "pools": ["p"]}] if signals else []
    return parse_config({"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": A}]}},
                         "entries": {"e": {"default": ["p"], "signals": signals, "decisions": decisions}},
                         "deployments": deployments}, env={})


def _attached(tasks: list[str], urls: tuple[str, ...] = (A,), **extra: Any) -> dict[str, Any]:
    return {"model": "m", "tasks": tasks, "attached": {"urls": list(urls), "api_key": "k"}, **extra}


def _json(value: object) -> Reply:
    return Reply(chunks=(json.dumps(value).encode(),))


def _embedding(*vectors: list[float]) -> Reply:
    return _json({"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v}
                                             for i, v in reversed(list(enumerate(vectors)))]})


def _run(config: RouterConfig, upstream: FakeUpstream, body: Callable[[Deployments], Awaitable[T]],
         *, ready: bool = True) -> T:
    async def go() -> T:
        runtime = Deployments(config, upstream)
        await runtime.start()
        try:
            if ready:
                await runtime.wait_ready()
            return await body(runtime)
        finally:
            await runtime.stop()

    return asyncio.run(go())


def test_embed_posts_vllms_embeddings_request_and_reads_the_rows_in_input_order() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _embedding([1.0, 0.0], [0.0, 1.0]))
    config = _config({"emb": _attached(["embed"])}, ("emb",))
    out = _run(config, upstream, lambda rt: rt.embed("emb", ["x", "y"], timeout_s=5))
    assert out.vectors == [[1.0, 0.0], [0.0, 1.0]] and out.worker == A and out.latency_s >= 0
    [sent] = upstream.sent
    assert (sent.path, sent.body, sent.api_key) == \
        ("/v1/embeddings", {"model": "m", "input": ["x", "y"], "encoding_format": "float",
                            "truncate_prompt_tokens": -1, "truncation_side": "left"}, "k")


def test_a_long_prompt_is_cut_to_the_context_keeping_its_end_not_refused() -> None:
    # Without truncation the frontend refuses a prompt past the context (400): every long request's
    # model signals would be unknown. -1: as much as the context holds; left: the latest turn kept.
    upstream = FakeUpstream()
    upstream.answer(A, _json({"data": [{"index": 0, "label": "b", "probs": [0.4, 0.6], "num_classes": 2}]}))
    config = _config({"cls": _attached(["classify"], labels=["a", "b"])}, ("cls",))
    _run(config, upstream, lambda rt: rt.classify("cls", ["x"], timeout_s=5))
    keep_end = {"truncate_prompt_tokens": -1, "truncation_side": "left"}
    assert upstream.sent[0].body == {"model": "m", "input": ["x"], **keep_end}


def test_more_texts_than_one_call_may_carry_go_as_several_calls_joined_in_order() -> None:
    upstream = FakeUpstream()  # the frontend refuses more than 2048 inputs in one call
    upstream.answer(A, _embedding(*[[float(i)] for i in range(2048)]), _embedding([2048.0], [2049.0]))
    config = _config({"emb": _attached(["embed"])}, ("emb",))
    out = _run(config, upstream, lambda rt: rt.embed("emb", [str(i) for i in range(2050)], timeout_s=5))
    assert [len(s.body["input"]) for s in upstream.sent] == [2048, 2]
    assert out.vectors == [[float(i)] for i in range(2050)] and out.worker == A


def test_classify_names_every_probability_and_the_top_label_by_the_known_names() -> None:
    upstream = FakeUpstream()
    # The worker's own label is its checkpoint's (LABEL_1 when it has no id2label): the names given win.
    upstream.answer(A, _json({"data": [{"index": 0, "label": "LABEL_1", "probs": [0.1, 0.7, 0.2], "num_classes": 3}]}))
    config = _config({"cls": _attached(["classify"], labels=["chat", "code", "math"])}, ("cls",))
    out = _run(config, upstream, lambda rt: rt.classify("cls", ["def f(): pass"], timeout_s=5))
    [label] = out.results
    assert (label.label, label.probability) == ("code", 0.7)
    assert label.probs == {"chat": 0.1, "code": 0.7, "math": 0.2}
    assert upstream.sent[0].path == "/classify" and upstream.sent[0].body["input"] == ["def f(): pass"]


def test_class_names_that_do_not_fit_the_classes_fail_naming_the_field_and_blame_no_worker() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _json({"data": [{"index": 0, "label": "LABEL_1", "probs": [0.4, 0.6], "num_classes": 2}]}))
    config = _config({"cls": _attached(["classify"], labels=["a", "b", "c"])}, ("cls",))

    async def body(rt: Deployments) -> tuple[str, int]:
        with pytest.raises(ModelUnavailable) as info:
            await rt.classify("cls", ["x"], timeout_s=5)
        return str(info.value), rt.started["cls"].pool.replicas[0].request_failures

    reason, failures = _run(config, upstream, body)
    assert reason == "deployment 'cls': 3 class names for the worker's 2 classes: fix deployments.cls.labels"
    assert failures == 0


def test_classify_without_known_class_names_names_them_as_transformers_does() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _json({"data": [{"index": 0, "label": "LABEL_1", "probs": [0.4, 0.6], "num_classes": 2}]}))
    config = _config({"cls": _attached(["classify"])}, ("cls",))  # model "m": no checkpoint here to read
    [label] = _run(config, upstream, lambda rt: rt.classify("cls", ["x"], timeout_s=5)).results
    assert label.probs == {"LABEL_0": 0.4, "LABEL_1": 0.6}


def test_rerank_gives_scores_in_document_order_though_vllm_sorts_them_by_relevance() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _json({"id": "r", "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1},
                              "results": [{"index": 1, "document": {"text": "b"}, "relevance_score": 0.9},
                                          {"index": 0, "document": {"text": "a"}, "relevance_score": 0.2}]}))
    config = _config({"ce": _attached(["score"])}, ("ce",))
    out = _run(config, upstream, lambda rt: rt.rerank("ce", "q", ["a", "b"], timeout_s=5))
    assert out.scores == [0.2, 0.9]
    assert upstream.sent[0].path == "/rerank"
    assert upstream.sent[0].body == {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 0,
                                     "truncate_prompt_tokens": -1}


def _unavailable(config: RouterConfig, upstream: FakeUpstream,
                 call: Callable[[Deployments], Awaitable[object]], *, ready: bool = True) -> str:
    async def body(rt: Deployments) -> str:
        with pytest.raises(ModelUnavailable) as info:
            await call(rt)
        return str(info.value)

    return _run(config, upstream, body, ready=ready)


def test_no_call_goes_to_a_worker_before_its_first_check_passed() -> None:
    upstream = FakeUpstream()
    config = _config({"emb": _attached(["embed"])}, ("emb",))

    async def body(rt: Deployments) -> tuple[bool, str]:
        with pytest.raises(ModelUnavailable) as info:
            await rt.embed("emb", ["x"], timeout_s=5)
        ready, _, _ = rt.readiness()
        return ready, str(info.value)

    ready, reason = _run(config, upstream, body, ready=False)
    assert not ready and not upstream.sent
    assert reason == f"deployment 'emb': no ready replica: {A}: unhealthy (starting: not checked yet)"


def test_the_router_is_ready_once_each_used_deployment_has_a_ready_worker() -> None:
    config = _config({"emb": _attached(["embed"]), "idle": _attached(["embed"], (B,))}, ("emb",))
    ready, _, states = _run(config, FakeUpstream(), lambda rt: asyncio.sleep(0, rt.readiness()))
    assert ready and list(states) == ["emb"]  # "idle" is used by nothing: not started, not waited for
    assert states["emb"]["used_by"] == ["signal entries.e.signals[0] (s0, embedding)"]
    assert [w["url"] for w in states["emb"]["workers"]] == [A] and states["emb"]["workers"][0]["ready"]


def test_a_deployment_nothing_uses_has_no_workers() -> None:
    config = _config({"emb": _attached(["embed"]), "idle": _attached(["embed"], (B,))}, ("emb",))
    reason = _unavailable(config, FakeUpstream(), lambda rt: rt.embed("idle", ["x"], timeout_s=5))
    assert reason == "deployment 'idle' has no workers: nothing in the config uses it"


def test_a_call_the_deployment_does_not_serve_is_unavailable_and_sends_nothing() -> None:
    upstream = FakeUpstream()
    config = _config({"emb": _attached(["embed"])}, ("emb",))
    reason = _unavailable(config, upstream, lambda rt: rt.rerank("emb", "q", ["d"], timeout_s=5))
    assert reason == "deployment 'emb' does not serve rerank (tasks: embed)" and not upstream.sent


def test_every_worker_full_is_answered_at_once_without_a_request() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(hang=True))
    config = _config({"emb": _attached(["embed"], max_inflight=1)}, ("emb",))

    async def body(rt: Deployments) -> str:
        first = asyncio.create_task(rt.embed("emb", ["x"], timeout_s=30))
        while not upstream.sent:  # the first call holds the only slot
            await asyncio.sleep(0)
        with pytest.raises(ModelUnavailable) as info:
            await rt.embed("emb", ["y"], timeout_s=30)
        first.cancel()
        return str(info.value)

    reason = _run(config, upstream, body)
    assert reason == "every worker full: deployment 'emb': all 1 ready replicas are at 1 in-flight requests or probing"
    assert len(upstream.sent) == 1


def test_a_worker_that_never_answers_is_unavailable_at_the_deadline_and_its_slot_freed() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(hang=True))
    config = _config({"emb": _attached(["embed"])}, ("emb",))

    async def body(rt: Deployments) -> tuple[str, int]:
        with pytest.raises(ModelUnavailable) as info:
            await rt.embed("emb", ["x"], timeout_s=0.05)
        return str(info.value), rt.started["emb"].pool.replicas[0].inflight

    reason, inflight = _run(config, upstream, body)
    assert reason == f"deployment 'emb': no answer within 0.05s (tried {A})" and inflight == 0


def test_the_deployments_own_timeout_caps_the_callers_deadline() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(hang=True))
    config = _config({"emb": _attached(["embed"], timeout_s=0.05)}, ("emb",))
    reason = _unavailable(config, upstream, lambda rt: rt.embed("emb", ["x"], timeout_s=3600))
    assert reason.endswith("no answer within 0.05s (tried http://a:8000)")


def test_a_failed_worker_is_tried_again_on_another() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(refuse="HTTP 500: boom", retryable=False))
    upstream.answer(B, _embedding([1.0]))
    config = _config({"emb": _attached(["embed"], (A, B))}, ("emb",))
    out = _run(config, upstream, lambda rt: rt.embed("emb", ["x"], timeout_s=5))
    assert out.worker == B and upstream.urls() == [A, B]


def test_answers_not_of_the_pooling_apis_shape_fail_with_each_reason() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _json({"data": []}))
    upstream.answer(B, Reply(chunks=(b"not json",)))
    config = _config({"emb": _attached(["embed"], (A, B))}, ("emb",))
    reason = _unavailable(config, upstream, lambda rt: rt.embed("emb", ["x"], timeout_s=5))
    assert reason.startswith("deployment 'emb': no ready replica:")  # both tried, both excluded
    assert f"{A}: answered /v1/embeddings with a body that is not the pooling API's: data: expected 1 rows, " \
           "got 0 rows" in reason
    assert f"{B}: answered /v1/embeddings with a body that is not the pooling API's: JSON is malformed" in reason


def test_a_refused_call_is_not_sent_elsewhere_and_says_what_the_worker_said() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(status=400, chunks=(b'{"error": {"message": "input too long"}}',)))
    config = _config({"emb": _attached(["embed"], (A, B))}, ("emb",))
    reason = _unavailable(config, upstream, lambda rt: rt.embed("emb", ["x"], timeout_s=5))
    assert upstream.urls() in ([A], [B])
    assert "refused /v1/embeddings: HTTP 400: " in reason and "input too long" in reason


def test_a_deployment_is_scheduled_by_the_chat_pools_scheduler() -> None:
    """The same class, so the same rule: with equal outstanding bytes, ties go to the least recently
    assigned worker (the calls alternate)."""
    upstream = FakeUpstream()
    upstream.answer(A, _embedding([1.0]))
    upstream.answer(B, _embedding([1.0]))
    config = _config({"emb": _attached(["embed"], (A, B))}, ("emb",))

    async def body(rt: Deployments) -> tuple[Pool, list[str]]:
        workers = [(await rt.embed("emb", ["x"], timeout_s=5)).worker for _ in range(4)]
        return rt.started["emb"].pool, workers

    pool, workers = _run(config, upstream, body)
    assert type(pool) is Pool and pool.kind == "deployment"
    assert workers == [A, B, A, B]


def test_classify_names_the_probabilities_by_the_checkpoints_id2label() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, _json({"data": [{"index": 0, "label": "math", "probs": [0.2, 0.3, 0.5], "num_classes": 3}]}))
    config = _config({"cls": {**_attached(["classify"]), "model": "tiny-classifier"}}, ("cls",))
    [label] = _run(config, upstream, lambda rt: rt.classify("cls", ["1 + 1"], timeout_s=5)).results
    assert label.probs == {"chat": 0.2, "code": 0.3, "math": 0.5}  # checkpoints' tiny-classifier config.json


def test_the_routers_ready_route_answers_503_until_the_deployments_are_ready() -> None:
    from services.router.app import RouterApp
    from services.router.backends.pool import build_pools
    from services.router.decision.engine import Router
    from services.router.metrics import RouterMetrics
    from tests.support.asgi_client import request

    config = _config({"emb": _attached(["embed"])}, ("emb",))
    plain = dataclasses.replace(config, entries={"e": EntryConfig("e", ("p",))})  # no signal to warm here
    pools = build_pools(config)

    async def go() -> list[tuple[int, Any]]:
        upstream = FakeUpstream()
        runtime = Deployments(config, upstream)
        app = RouterApp(config, Router(plain), pools, upstream, RouterMetrics(pools), runtime=runtime)
        bare = RouterApp(config, Router(plain), pools, upstream, RouterMetrics(pools))
        try:
            await runtime.start()
            answers = [await request(app, "GET", "/ready")]
            await runtime.wait_ready()
            answers += [await request(app, "GET", "/ready"), await request(bare, "GET", "/ready")]
        finally:
            await runtime.stop()
            for a in (app, bare):
                a.close()
        return [(a.status, a.json()["status"]) for a in answers]

    assert asyncio.run(go()) == [(503, "starting"), (200, "ready"), (200, "ready")]


class _Health(FakeUpstream):
    """Health answers per worker URL; `checked` is set at each check of `watch`."""

    def __init__(self, down: set[str], watch: str) -> None:
        super().__init__()
        self.down, self.watch, self.checked = down, watch, asyncio.Event()

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        if url.startswith(self.watch):
            self.checked.set()
        return (False, "HTTP 503") if any(url.startswith(u) for u in self.down) else (True, "HTTP 200")


def test_a_deployment_never_ready_does_not_stop_the_health_checks_of_the_others() -> None:
    upstream = _Health(down={B}, watch=A)  # B never becomes ready
    config = _config({"emb": _attached(["embed"], health={"interval_s": 0.01, "failures": 1}),
                      "stuck": _attached(["embed"], (B,))}, ("emb", "stuck"))

    async def go() -> bool:
        runtime = Deployments(config, upstream)
        await runtime.start()
        waiting = asyncio.create_task(runtime.wait_ready())
        try:
            async with asyncio.timeout(5):
                while not runtime.started["emb"].ready:
                    await upstream.checked.wait()
                    upstream.checked.clear()
                upstream.down.add(A)  # emb's worker dies while stuck is still starting
                pool = runtime.started["emb"].pool
                while pool.is_ready(pool.replicas[0]):
                    await upstream.checked.wait()
                    upstream.checked.clear()
            return waiting.done()
        finally:
            waiting.cancel()
            await runtime.stop()

    assert asyncio.run(go()) is False  # emb's worker is seen down though the start never ended


class _FlakyHealth(FakeUpstream):
    """A health check that raises once (a bug, not a failed check), then answers."""

    raised = False

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a bug in a check")
        return True, "HTTP 200"


def test_a_check_round_that_raises_at_start_does_not_end_the_wait_for_ready() -> None:
    config = _config({"emb": _attached(["embed"])}, ("emb",))
    ready, _, _ = _run(config, _FlakyHealth(), lambda rt: asyncio.sleep(0, rt.readiness()))
    assert ready


def test_a_failed_start_task_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        task = asyncio.get_running_loop().create_task(asyncio.sleep(0, None))
        failing = asyncio.get_running_loop().create_task(_raise())
        await asyncio.gather(task, failing, return_exceptions=True)
        log_start_failure(failing)

    asyncio.run(go())
    assert "the model runtime's start failed" in caplog.text and "boom" in caplog.text


async def _raise() -> None:
    raise RuntimeError("boom")


def test_ready_reports_degraded_when_a_deployment_lost_every_worker_and_shows_detail_only_with_a_key() -> None:
    from services.router.app import RouterApp
    from services.router.backends.pool import build_pools
    from services.router.decision.engine import Router
    from services.router.metrics import RouterMetrics
    from tests.support.asgi_client import request

    config = _config({"emb": _attached(["embed"], health={"failures": 1})}, ("emb",))
    config = dataclasses.replace(config, listeners=(dataclasses.replace(config.listeners[0], api_keys=("k",)),))
    plain = dataclasses.replace(config, entries={"e": EntryConfig("e", ("p",))})
    pools = build_pools(config)

    async def go() -> list[tuple[int, Any]]:
        upstream = _Health(down=set(), watch=A)
        runtime = Deployments(config, upstream)
        app = RouterApp(config, Router(plain), pools, upstream, RouterMetrics(pools), runtime=runtime)
        key = {"authorization": "Bearer k"}
        try:
            await runtime.start()
            await runtime.wait_ready()
            answers = [await request(app, "GET", "/ready"), await request(app, "GET", "/ready", headers=key)]
            upstream.down.add(A)  # the only worker dies
            await runtime.checker.check_once("emb")
            answers += [await request(app, "GET", "/ready"), await request(app, "GET", "/ready", headers=key)]
        finally:
            await runtime.stop()
            app.close()
        return [(a.status, a.json()) for a in answers]

    (s1, open1), (s2, keyed1), (s3, open2), (s4, keyed2) = asyncio.run(go())
    assert (s1, open1) == (200, {"status": "ready"})  # no key: no worker addresses
    assert s2 == 200 and keyed1["status"] == "ready" and keyed1["deployments"]["emb"]["workers"][0]["url"] == A
    assert (s3, open2) == (200, {"status": "degraded"})  # still routing: its signals are unknown
    assert s4 == 200 and keyed2["degraded"] == ["emb"] and keyed2["deployments"]["emb"]["ready"] is False


def test_a_hung_worker_gets_a_share_of_the_deadline_so_another_answers_and_it_is_counted_failed() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(hang=True))
    upstream.answer(B, _embedding([1.0]))
    config = _config({"emb": _attached(["embed"], (A, B), timeout_s=0.2)}, ("emb",))

    async def body(rt: Deployments) -> tuple[str, list[int]]:
        rt.started["emb"].pool.replicas.sort(key=lambda r: r.url != A)  # A first: the scheduler's tie
        picked = rt.started["emb"].pool
        out = await rt.embed("emb", ["x"], timeout_s=5)
        return out.worker, [r.request_failures for r in picked.replicas]

    worker, failures = _run(config, upstream, body)
    assert upstream.urls() == [A, B] and worker == B  # A had half the deadline, B the rest
    assert failures == [1, 0]  # past its share of the deployment's timeout_s: A's fault


def test_a_worker_past_only_the_callers_shorter_budget_is_not_blamed() -> None:
    upstream = FakeUpstream()
    upstream.answer(A, Reply(hang=True))
    config = _config({"emb": _attached(["embed"])}, ("emb",))  # timeout_s: the default, far longer

    async def body(rt: Deployments) -> int:
        with pytest.raises(ModelUnavailable):
            await rt.embed("emb", ["x"], timeout_s=0.05)
        return rt.started["emb"].pool.replicas[0].request_failures

    assert _run(config, upstream, body) == 0
