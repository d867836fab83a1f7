"""The model runtime (router process): the deployments the config uses, each a Pool of workers
(managed: started and supervised here; attached: URLs), health-checked like the chat pools, and the
`DecisionModels` calls answered by one worker each, chosen by the pools' scheduler.

Start: workers of every used deployment are started (unused ones start nothing, and say so), then
`wait_ready` returns once each has a ready worker (each one's health checks start as it becomes
ready); the router's /ready says ready only after that.
A call never waits past its deadline: no worker, every worker full, a failure or a timeout is a
ModelUnavailable saying which and why, with the status the System One API answers (models.py).
An attached deployment with `api: systemone` is spoken to by that API (systemone_api.py), every other
one by vLLM's pooling API (pooling_api.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import msgspec

import checkpoints
from services.router.backends.health import Checked, HealthChecker
from services.router.backends.pool import Lease, NoReplica, Overloaded, Pool
from services.router.backends.upstream import READ_ERRORS, Upstream, UpstreamError
from services.router.config import DeploymentConfig, RouterConfig
from services.router.runtime import pooling_api, systemone_api
from services.router.runtime.demand import used_deployments
from services.router.runtime.labels import class_names
from services.router.runtime.managed import ManagedReplica, Secrets
from services.router.runtime.models import Classified, Embedded, Label, ModelUnavailable, Reranked

log = logging.getLogger("router.runtime")
T = TypeVar("T")

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
READY_POLL_S = 0.2  # at start, how often a starting worker is checked (then: its health interval)
CALLS = {"embed": ("embed",), "classify": ("classify",), "rerank": ("score", "rerank")}  # call -> tasks
# A worker's refusal of the call that is about the input (too long, no tokens): the client's to fix, a
# 400 passed on. Any other refusal (401, 404: the router's key or model name) is the config's: a 502.
INPUT_REFUSALS = (400, 413, 422)
INPUT_FIELDS = ("input", "query", "documents")  # what a refusal's `param` may name: the client sent them


@dataclass(slots=True)
class Deployment:
    config: DeploymentConfig
    pool: Pool
    reasons: list[str]  # why it is started: the signals that use it
    api_key: str | None = None
    managed: list[ManagedReplica] = field(default_factory=list)
    labels: list[str] | None = None  # classify: class names by index
    labels_source: str = ""  # where they came from (a wrong count names it)
    labels_logged: bool = False  # a wrong count is logged once, not per call
    ready: bool = False  # had a ready worker once: the start is over

    @property
    def systemone(self) -> bool:
        """Spoken to by the System One API (an attached engine-mode router or the like), not vLLM's pooling API."""
        return self.config.attached is not None and self.config.attached.api == "systemone"


class Deployments:
    """The `DecisionModels` port's implementation; `start`, `wait_ready` and `stop` are the server's."""

    def __init__(self, config: RouterConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream
        self.started: dict[str, Deployment] = {}
        self.checker = HealthChecker({}, upstream)

    # ---- start and stop ----

    async def start(self) -> None:
        """Workers for every deployment the config uses; a managed model that does not resolve to a
        checkpoint raises checkpoints.CheckpointError (the router cannot start)."""
        used = used_deployments(self.config)
        for name, config in self.config.deployments.items():
            if name not in used:
                log.info("deployment %s: not started: no signal uses it", name)
                continue
            deployment = await self._deployment(config, used[name])
            self.started[name] = deployment
            for replica in deployment.managed:
                replica.start()
            where = (f"{len(deployment.managed)} managed {config.managed.backend} worker(s)" if config.managed
                     else f"attached {', '.join(r.url for r in deployment.pool.replicas)}")
            log.info("deployment %s: started %s for %s%s (tasks %s): used by %s", name, where, config.model,
                     f" revision {config.revision}" if config.revision else "", ", ".join(config.tasks),
                     "; ".join(used[name]))
        self.checker = HealthChecker({name: Checked(d.pool, d.config.health, d.api_key)
                                      for name, d in self.started.items()}, self.upstream)

    async def _deployment(self, config: DeploymentConfig, reasons: list[str]) -> Deployment:
        managed: list[ManagedReplica] = []
        api_key: str | None
        if config.managed is not None:
            await asyncio.to_thread(checkpoints.resolve, config.model)  # a bad --model fails the start here
            keys = Secrets.fresh()
            managed = [ManagedReplica(config, i, keys) for i in range(config.managed.replicas)]
            urls, api_key = [r.url for r in managed], keys.api_key
        else:
            assert config.attached is not None  # the loader sets exactly one
            urls, api_key = list(config.attached.urls), config.attached.api_key
        pool = Pool(config.name, urls, max_inflight=config.max_inflight, failures=config.breaker.failures,
                    cooldown_s=config.breaker.cooldown_s, unhealthy_after=config.health.failures, kind="deployment")
        for replica in pool.replicas:  # no call goes to a worker before a check passed
            replica.healthy, replica.health_detail = False, "starting: not checked yet"
        deployment = Deployment(config, pool, reasons, api_key, managed)
        if "classify" in config.tasks and not deployment.systemone:  # a System One server names its classes
            deployment.labels, source = await asyncio.to_thread(class_names, config)
            deployment.labels_source = source
            log.info("deployment %s: class names from %s", config.name, source)
        return deployment

    async def wait_ready(self) -> None:
        """Until every started deployment has a ready worker (checked every READY_POLL_S); each one's
        health checks run at its own interval from the moment it is ready, whatever the others do. A
        deployment still not ready after its start_timeout_s is logged as an error; the router stays
        not ready, and the wait goes on."""
        await asyncio.gather(*(self._until_ready(name, d) for name, d in self.started.items()))

    async def _until_ready(self, name: str, deployment: Deployment) -> None:
        began = time.monotonic()
        warned = False
        while True:
            try:
                await self.checker.check_once(name)
            except Exception:  # as the checker's own loop: a bug in one round must not end the wait
                log.exception("deployment %s: health check round failed", name)
            ready = [r.url for r in deployment.pool.replicas if deployment.pool.is_ready(r)]
            if ready:
                deployment.ready = True
                self.checker.start([name])
                log.info("deployment %s: ready in %.1fs (%s)", name, time.monotonic() - began, ", ".join(ready))
                return
            if not warned and time.monotonic() - began > deployment.config.start_timeout_s:
                warned = True
                log.error("deployment %s: no worker ready after %.0fs (start_timeout_s): %s", name,
                          deployment.config.start_timeout_s, _states(deployment.pool))
            await asyncio.sleep(READY_POLL_S)

    async def stop(self) -> None:
        await self.checker.stop()
        await asyncio.gather(*(r.stop() for d in self.started.values() for r in d.managed))

    def readiness(self) -> tuple[bool, list[str], dict[str, Any]]:
        """Whether every started deployment had a ready worker once (the start is over), the ones with
        none ready now (degraded: their signals are unknown), and each one's state (the router's /ready)."""
        states: dict[str, Any] = {}
        down: list[str] = []
        for name, d in self.started.items():
            workers = d.pool.snapshot()
            for worker, replica in zip(workers, d.managed, strict=False):
                worker.update(replica.describe())
            ready_now = any(w["ready"] for w in workers)
            if d.ready and not ready_now:
                down.append(name)
            states[name] = {"model": d.config.model, "revision": d.config.revision, "tasks": list(d.config.tasks),
                            "started": d.ready, "ready": ready_now, "used_by": d.reasons, "workers": workers}
        return all(d.ready for d in self.started.values()), down, states

    # ---- the DecisionModels calls ----
    # `truncate`: a text past the model's context is cut (signals: a long prompt must not make them
    # unknown); False, the System One API's calls: the worker refuses it, a 400 the client gets.

    async def embed(self, deployment: str, texts: list[str], *, timeout_s: float, truncate: bool = True) -> Embedded:
        """Texts past pooling_api.MAX_INPUTS (a signal's many examples) go as several calls at once, each
        answered by one worker; the answer names the workers of all of them."""
        d = self._callable(deployment, "embed")
        if len(texts) <= pooling_api.MAX_INPUTS:
            return await self._embed(d, texts, timeout_s, truncate)
        chunks = [texts[i:i + pooling_api.MAX_INPUTS] for i in range(0, len(texts), pooling_api.MAX_INPUTS)]
        answers = await asyncio.gather(*(self._embed(d, chunk, timeout_s, truncate) for chunk in chunks))
        workers = ", ".join(dict.fromkeys(a.worker for a in answers))
        return Embedded(workers, max(a.latency_s for a in answers), [v for a in answers for v in a.vectors],
                        prompt_tokens=sum(a.prompt_tokens for a in answers))

    async def _embed(self, d: Deployment, texts: list[str], timeout_s: float, truncate: bool) -> Embedded:
        if d.systemone:
            call, reader = systemone_api.embed_call(d.config.model, texts), systemone_api.embeddings
        else:
            call, reader = pooling_api.embed_call(d.config.model, texts, truncate=truncate), pooling_api.embeddings
        vectors, worker, latency, tokens = await self._call(d, call, timeout_s,
                                                            lambda answer: reader(answer, call.expected))
        return Embedded(worker, latency, vectors, prompt_tokens=tokens)

    async def classify(self, deployment: str, texts: list[str], *, timeout_s: float,
                       truncate: bool = True) -> Classified:
        d = self._callable(deployment, "classify")
        reader: Callable[[dict[str, Any], int], list[Label]]
        if d.systemone:
            call, reader = systemone_api.classify_call(d.config.model, texts), systemone_api.labels
        else:
            call, reader = pooling_api.classify_call(d.config.model, texts, truncate=truncate), partial(_labels, d)
        results, worker, latency, tokens = await self._call(d, call, timeout_s,
                                                            lambda answer: reader(answer, call.expected))
        return Classified(worker, latency, results, prompt_tokens=tokens)

    async def rerank(self, deployment: str, query: str, documents: list[str], *, timeout_s: float,
                     truncate: bool = True) -> Reranked:
        d = self._callable(deployment, "rerank")
        if d.systemone:
            call, reader = systemone_api.rerank_call(d.config.model, query, documents), systemone_api.relevance
        else:
            call = pooling_api.rerank_call(d.config.model, query, documents, truncate=truncate)
            reader = pooling_api.relevance
        scores, worker, latency, tokens = await self._call(d, call, timeout_s,
                                                           lambda answer: reader(answer, call.expected))
        return Reranked(worker, latency, scores, prompt_tokens=tokens)

    def _callable(self, name: str, call: str) -> Deployment:
        config = self.config.deployments[name]  # KeyError: not declared (the loader refuses such a signal)
        if not set(CALLS[call]) & set(config.tasks):
            raise ModelUnavailable(f"deployment {name!r} does not serve {call} (tasks: {', '.join(config.tasks)})")
        deployment = self.started.get(name)
        if deployment is None:
            raise ModelUnavailable(f"deployment {name!r} has no workers: nothing in the config uses it")
        return deployment

    async def _call(self, d: Deployment, call: pooling_api.Call, timeout_s: float,
                    read: Callable[[dict[str, Any]], T]) -> tuple[T, str, float, int]:
        """The first answer a worker gives, `read` into results, and that worker, the call's latency and
        the answer's token count, within min(timeout_s, the deployment's timeout_s). A pooling call
        changes nothing on a worker, so one that failed is tried on another; each attempt gets its share
        of the time left (split among the workers not tried yet), so a hung worker leaves time to try
        another. Statuses: every worker full 429, none ready 503 (502 once one failed), no answer in
        time 504, the input refused 400."""
        deadline = min(timeout_s, d.config.timeout_s)
        # Past its share of the deployment's own bound a worker is at fault (its breaker counts it); a
        # caller's shorter budget says nothing about the worker.
        blame = d.config.timeout_s <= timeout_s
        payload = _json.encode(call.body)
        tried: list[str] = []
        errors: list[str] = []
        started = time.perf_counter()
        # No timeout around the loop: every wait is an attempt's, within its share, and the shares of
        # the time left add up to the deadline (the last attempt has all of it), so a hung worker is
        # always ended by its own timeout and counted.
        try:
            while True:
                lease = d.pool.acquire(len(payload), exclude=frozenset(tried))
                if isinstance(lease, Overloaded):
                    raise ModelUnavailable(_failed(errors, f"every worker full: {lease.reason}"), 429,
                                           retry_after_s=lease.retry_after_s)
                if isinstance(lease, NoReplica):
                    # After a failure the workers left are the ones tried: the failures are the reason.
                    raise ModelUnavailable(_failed(errors, lease.reason), 502 if errors else 503)
                tried.append(lease.replica.url)
                left = deadline - (time.perf_counter() - started)
                share = left / max(1, len(d.pool.replicas) - len(tried) + 1)
                try:
                    answered = await self._attempt(d, lease, call, payload, share, blame, read, errors)
                except _PastShare:
                    if share >= left or len(tried) >= len(d.pool.replicas):
                        raise TimeoutError from None  # the whole deadline is spent: said below
                    errors.append(f"{lease.replica.url}: no answer within its share, {share:.3g}s")
                    continue
                if answered is not None:
                    result, tokens = answered
                    return result, lease.replica.url, time.perf_counter() - started, tokens
        except TimeoutError:
            where = f" (tried {', '.join(tried)})" if tried else ""
            raise ModelUnavailable(_failed(errors, f"deployment {d.config.name!r}: no answer within "
                                                   f"{deadline:g}s{where}"), 504) from None

    async def _attempt(self, d: Deployment, lease: Lease, call: pooling_api.Call, payload: bytes, share: float,
                       blame: bool, read: Callable[[dict[str, Any]], T], errors: list[str]) -> tuple[T, int] | None:
        """One worker's answer read, with its token count, or None with the reason added to `errors` (the
        worker failed: try another); _PastShare when it did not answer within `share` (a failure when
        `blame`). A refusal of the call itself (4xx) is no worker's fault and fails the call."""
        url, path, ok, unreachable = lease.replica.url, call.path, None, False
        try:
            async with asyncio.timeout(share):
                response = await self.upstream.open(url, path, payload, api_key=d.api_key, timeout_s=share)
                try:
                    body = await response.read()
                finally:
                    response.close()
            if response.status != 200:  # the worker answered; its breaker stays as it is (ok None)
                raise _refused(errors, url, path, response.status, body)
            value = _decode.decode(body)
            if not isinstance(value, dict):
                raise pooling_api.BadAnswer(f"JSON that is not an object: {body[:80]!r}")
            result = read(value)
            ok = True
            return result, pooling_api.tokens(value, call.usage)
        except TimeoutError:  # its share spent (asyncio's or the client's own read timeout)
            ok = False if blame else None
            raise _PastShare from None
        except UpstreamError as exc:
            ok, unreachable = False, exc.unreachable
            errors.append(str(exc))
        except READ_ERRORS as exc:
            ok = False
            errors.append(f"{url}: the answer broke off: {type(exc).__name__}")
        except (msgspec.DecodeError, pooling_api.BadAnswer) as exc:
            ok = False
            api = "System One" if d.systemone else "pooling"
            errors.append(f"{url}: answered {path} with a body that is not the {api} API's: {exc}")
        finally:
            lease.release(ok, unreachable=unreachable)  # None when cancelled: a deadline blames no worker
        return None


class _PastShare(Exception):
    """An attempt that got no answer within its share of the call's deadline."""


def _labels(d: Deployment, answer: dict[str, Any], expected: int) -> list[Label]:
    """The answer's classes named; names that do not fit are the config's fault (or the checkpoint's):
    the call fails naming where they came from, no worker is blamed, and the log says it once."""
    try:
        return pooling_api.labels(answer, expected, d.labels)
    except pooling_api.WrongNames as exc:
        where = f"deployments.{d.config.name}.labels" if d.config.labels else d.labels_source
        reason = f"deployment {d.config.name!r}: {exc}: fix {where}"
        if not d.labels_logged:
            d.labels_logged = True
            log.error("%s", reason)
        raise ModelUnavailable(reason, 502) from None


def _refused(errors: list[str], url: str, path: str, status: int, body: bytes) -> ModelUnavailable:
    """A worker's refusal of the call: of the input (INPUT_REFUSALS) a 400 whose client message is the
    worker's own (no worker address in it), naming the field when the worker named one the client sent."""
    reason = _failed(errors, f"{url} refused {path}: HTTP {status}: {body[:300].decode(errors='replace')}")
    if status not in INPUT_REFUSALS:
        return ModelUnavailable(reason, 502)
    message, param = f"the model refused the input (HTTP {status})", None
    try:
        error = _decode.decode(body)
    except msgspec.DecodeError:
        error = None
    error = error.get("error", error) if isinstance(error, dict) else None  # OpenAI's shape, or a bare one
    if isinstance(error, dict):
        if isinstance(error.get("message"), str) and error["message"]:
            message = error["message"]
        named = error.get("param")
        if isinstance(named, str) and named.split("[", 1)[0].split(".", 1)[0] in INPUT_FIELDS:
            param = named
    return ModelUnavailable(reason, 400, refusal=message, param=param)


def _failed(errors: list[str], reason: str) -> str:
    return reason + (f"; failed before: {'; '.join(errors)}" if errors else "")


def _states(pool: Pool) -> str:
    """Each worker's state, as a call finding none ready would say it."""
    picked = pool.preview(0)
    return picked.reason if isinstance(picked, NoReplica) else "a worker is ready"
