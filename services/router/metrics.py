"""Prometheus metrics of the router process, in a registry it owns; replica and knowledge-base state is read
at scrape time, so the hot path only bumps counters. Shared by every layer: it imports no other router module."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Children:
    """A metric's labelled children, each looked up once: prometheus_client's labels() checks the values
    and takes a lock on every call, a cost paid per request otherwise. For labels of few values only."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Snapshots(Protocol):
    """What the replica and queue gauges read: a pool's replicas' state and its queue's depth per priority
    class (backends/pool.py's `Pool`)."""

    def snapshot(self) -> list[dict[str, Any]]: ...

    def queue_depths(self) -> Mapping[str, int]: ...


class KnowledgeState(Protocol):
    """What the knowledge gauges read: a knowledge base as of its last pass (plugins/knowledge.py's
    `KnowledgeBase`)."""

    @property
    def files(self) -> int: ...

    @property
    def chunks(self) -> int: ...

    @property
    def passes(self) -> int: ...

    @property
    def skip_counts(self) -> Mapping[str, int]: ...


class RouterMetrics:
    def __init__(self, pools: Mapping[str, Snapshots], knowledge: Mapping[str, KnowledgeState] | None = None) -> None:
        """`knowledge`: the knowledge bases by name, read at each scrape (the plugins' Shared.knowledge, which
        fills as the plugins are built, after this)."""
        self.registry = r = CollectorRegistry()
        self.decisions = Counter("router_decisions", "Routing decisions by entry and matched decision.",
                                 ["entry", "decision"], registry=r)
        self.requests = Counter("router_requests", "Requests answered, by listener, API and status.",
                                ["listener", "api", "status"], registry=r)
        self.overloaded = Counter("router_overloaded", "Requests answered 429 because every replica of "
                                  "every candidate pool was at its in-flight cap, by candidate pool.", ["pool"],
                                  registry=r)
        self.retries = Counter("router_retries", "Attempts retried on another replica after a failure "
                               "before the first response byte.", ["pool"], registry=r)
        # By pool only: replicas come and go with DNS, and per-replica state is in the gauges below.
        self.upstream_errors = Counter("router_upstream_errors", "Upstream failures (before or during a "
                                       "response) by pool.", ["pool"], registry=r)
        self.escalations = Counter("router_escalations", "Escalate stages whose answer failed the "
                                   "acceptance condition.", ["entry", "stage"], registry=r)
        self.upstream_latency = Histogram("router_upstream_latency_seconds", "Time from sending a request "
                                          "upstream to its response head.", ["pool"], buckets=_LATENCY,
                                          registry=r)
        # The per-request ones, their children looked up once per label values.
        self.requests_of, self.decisions_of = Children(self.requests), Children(self.decisions)
        self.lane = Counter("router_lane", "Requests the lane took (listeners/lane.py), by listener and how they "
                            "went on: streamed (answered in the connections' callbacks) or handed (to the ASGI "
                            "path's code at their first attempt).", ["listener", "outcome"], registry=r)
        self.lane_of = Children(self.lane)
        self.upstream_latency_of = Children(self.upstream_latency)
        self.signal_results = Counter("router_signal_results", "Signals evaluated, by entry, signal and "
                                      "result (matched, unmatched, unknown).", ["entry", "signal", "result"],
                                      registry=r)
        self.signal_latency = Histogram("router_signal_seconds", "Time a request waited for its model "
                                        "signals (only requests that needed one).", ["entry"],
                                        buckets=_LATENCY, registry=r)
        self.plugin_outcomes = Counter("router_plugin_outcomes", "Plugin request hooks by entry, plugin and "
                                       "outcome (semantic_cache: hit_exact, hit_semantic, miss; memory and rag: "
                                       "recalled, none; any: error, skipped).", ["entry", "plugin", "outcome"],
                                       registry=r)
        self.plugin_latency = Histogram("router_plugin_seconds", "Time a request hook took, by plugin.",
                                        ["plugin"], buckets=_LATENCY, registry=r)
        self.store_errors = Counter("router_store_errors", "Store calls that failed or ran past their "
                                    "timeout, by plugin (the request went on, or was refused if it fails "
                                    "closed).", ["plugin"], registry=r)
        self.queue_wait = Histogram("router_queue_wait_seconds", "Time a request waited in a pool's queue until "
                                    "a replica slot was handed to it, by pool and priority class.",
                                    ["pool", "class"], buckets=_WAIT, registry=r)
        self.queue_served = Counter("router_queue_served", "Requests that waited in a pool's queue and were "
                                    "handed a replica slot, by pool and priority class.", ["pool", "class"],
                                    registry=r)
        self.queue_rejections = Counter("router_queue_rejections", "Requests refused after every ready replica "
                                        "was at its cap, by pool, class, tenant and reason: full (the queue was "
                                        "full, or the pool has none: 429), ttl (waited the class's queue_ttl_s: "
                                        "429), no_endpoint (the last ready replica went while it waited: 503).",
                                        ["pool", "class", "tenant", "reason"], registry=r)
        self.queue_abandoned = Counter("router_queue_abandoned", "Queued requests whose client left (or whose "
                                       "deadline passed) while they waited, by pool and class.", ["pool", "class"],
                                       registry=r)
        self.limit_rejections = Counter("router_limit_rejections", "Requests refused (429) by a rate limit, by "
                                        "tenant, kind (requests, tokens) and level (tenant, user).",
                                        ["tenant", "kind", "level"], registry=r)
        self.limit_store_errors = Counter("router_limit_store_errors", "Shared rate limits' store calls that "
                                          "failed or ran past the store's timeout_s (the request counted here "
                                          "instead under admission.on_store_error open, refused 503 if closed).",
                                          registry=r)
        r.register(_ReplicaCollector(pools))
        r.register(_KnowledgeCollector({} if knowledge is None else knowledge))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ReplicaCollector(Collector):
    def __init__(self, pools: Mapping[str, Snapshots]) -> None:
        self._pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["pool", "replica"]
        inflight = GaugeMetricFamily("router_replica_inflight", "Requests in flight per replica.", labels=labels)
        outstanding = GaugeMetricFamily("router_replica_outstanding_bytes", "Request bytes sent and not yet "
                                        "finished per replica.", labels=labels)
        ready = GaugeMetricFamily("router_replica_ready", "1 when the replica is healthy and its breaker "
                                  "is not open.", labels=labels)
        breaker = GaugeMetricFamily("router_replica_breaker_open", "1 while the replica's circuit breaker "
                                    "is open or half-open.", labels=labels)
        queued = GaugeMetricFamily("router_queue_depth", "Requests waiting in a pool's queue for a replica slot, "
                                   "by pool and priority class (pools with a queue_size only).",
                                   labels=["pool", "class"])
        for name, pool in self._pools.items():
            for cls, depth in pool.queue_depths().items():
                queued.add_metric([name, cls], depth)
            for r in pool.snapshot():
                key = [name, r["url"]]
                inflight.add_metric(key, r["inflight"])
                outstanding.add_metric(key, r["outstanding_bytes"])
                ready.add_metric(key, 1 if r["ready"] else 0)
                breaker.add_metric(key, 0 if r["breaker"] == "closed" else 1)
        yield from (inflight, outstanding, ready, breaker, queued)


class _KnowledgeCollector(Collector):
    def __init__(self, bases: Mapping[str, KnowledgeState]) -> None:
        self._bases = bases

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        files = GaugeMetricFamily("router_knowledge_files", "Files indexed in the knowledge base's store, as of "
                                  "its last pass.", labels=["base"])
        skipped = GaugeMetricFamily("router_knowledge_files_skipped", "Files not indexed as of the last pass, "
                                    "by reason: too_big (over max_file_bytes), binary (a NUL byte, or not "
                                    "UTF-8), unreadable (not read this pass; what was indexed of it stays), "
                                    "other (the store refused it).", labels=["base", "reason"])
        chunks = GaugeMetricFamily("router_knowledge_chunks", "Chunks stored for the knowledge base, as of its "
                                   "last pass.", labels=["base"])
        passes = CounterMetricFamily("router_knowledge_passes", "Indexing passes completed.", labels=["base"])
        ready = GaugeMetricFamily("router_knowledge_ready", "1 once the knowledge base's first indexing pass "
                                  "completed (until then recall finds only what the store held already).",
                                  labels=["base"])
        for name in sorted(self._bases):
            base = self._bases[name]
            files.add_metric([name], base.files)
            chunks.add_metric([name], base.chunks)
            for reason, count in base.skip_counts.items():
                skipped.add_metric([name, reason], count)
            passes.add_metric([name], base.passes)
            ready.add_metric([name], 1 if base.passes else 0)
        yield from (files, skipped, chunks, passes, ready)
