"""Prometheus metrics under vLLM's names, in a registry owned by this process. With several API
server processes (`--api-server-count`), prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR,
set by the CLI before the import) makes one /metrics of all of them: counters and histograms add up,
and each gauge says how its processes' values combine."""
from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from protocol import ITERATION_TOKENS_BUCKETS, RequestTimings, Stats

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0)
# vLLM's buckets (vllm/v1/metrics/buckets.py) of its request phase times and of preemptions per request.
_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)
# The `le` of each Stats.iteration_tokens entry, as prometheus-client writes a Histogram's.
_ITERATION_LE = [*(floatToGoString(b) for b in ITERATION_TOKENS_BUCKETS), "+Inf"]


def tokens_buckets(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `limit`, as vLLM buckets its token-count histograms."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(float(m * scale))
        scale *= 10


class BatchedHistogram:
    """A histogram's observations counted here and added to it at flush(): the per-token path's (the
    inter-token latency) pays a bisect and two adds, not prometheus-client's observe (two locked
    increments and its checks, ~2 us of CPU a token at 256 streams). Same buckets, same result.

    `counts` holds a count per bound and then the sum of the values, in one list that lives as long as
    this does (flush() empties it in place): the C plain step (generation/_plainc.c) adds to it too."""

    __slots__ = ("_child", "_zero", "bounds", "counts")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self.bounds: list[float] = list(child._upper_bounds)  # the last is +Inf
        self._zero: list[float] = [0] * len(self.bounds) + [0.0]
        self.counts: list[float] = self._zero[:]

    def observe(self, value: float) -> None:
        counts = self.counts
        counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound
        counts[-1] += value

    def flush(self) -> None:
        counts = self.counts
        if not any(counts):
            return
        buckets = self._child._buckets
        for i, n in enumerate(counts[:-1]):
            if n:
                buckets[i].inc(n)
        self._child._sum.inc(counts[-1])
        counts[:] = self._zero


class BatchedCounter:
    """A counter's (or a gauge's) increments summed here and added to it at flush(): one float add per
    request, not prometheus-client's locked inc and its checks. The same total at every scrape."""

    __slots__ = ("_child", "_value")

    def __init__(self, child: Counter | Gauge) -> None:
        self._child = child
        self._value: float = 0

    def inc(self, amount: float = 1) -> None:
        self._value += amount

    def dec(self, amount: float = 1) -> None:
        """A gauge's (requests in flight): its net change is what flush() adds."""
        self._value -= amount

    def flush(self) -> None:
        if self._value:
            self._child.inc(self._value)
            self._value = 0


class _FlushingRegistry(CollectorRegistry):
    """A registry whose every read (a scrape, a test's get_sample_value) first adds the batched
    observations, so no reader sees a figure the batching holds back."""

    def __init__(self, flush: Callable[[], None]) -> None:
        super().__init__()
        self._flush = flush

    def collect(self) -> Iterable[Metric]:
        self._flush()
        return super().collect()


@dataclass(slots=True)
class Parent:
    """A request of n choices (request_done)."""

    n: int
    left: int  # choices not ended yet
    longest: int = 0  # the most tokens one of its ended choices generated


@dataclass(frozen=True, slots=True)
class EngineView:
    """What /metrics reads of one engine rank at scrape time."""

    rank: int
    stats: Stats | None  # its latest load report
    block_size: int  # from its Ready; 0 before the handshake
    num_kv_blocks: int


class Metrics:
    def __init__(self, model_name: str, *, max_model_len: int = 1 << 20) -> None:
        # Every per-request figure is batched (BatchedHistogram, BatchedCounter): ~16 locked prometheus-client
        # calls a request otherwise (~5% of a short stream's frontend CPU); flush() adds them, at every read.
        self.registry = _FlushingRegistry(self.flush)
        labels = ["model_name"]
        r = self.registry
        self.ttft = BatchedHistogram(Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                                               buckets=_LATENCY, registry=r).labels(model_name))
        self.itl = BatchedHistogram(Histogram("vllm:inter_token_latency_seconds", "Time between output tokens.",
                                              labels, buckets=_LATENCY, registry=r).labels(model_name))
        self.e2e = BatchedHistogram(Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                                              labels, buckets=_LATENCY, registry=r).labels(model_name))
        self.prompt_tokens = BatchedCounter(Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels,
                                                    registry=r).labels(model_name))
        self.generation_tokens = BatchedCounter(Counter("vllm:generation_tokens", "Generation tokens processed.",
                                                        labels, registry=r).labels(model_name))
        tokens = tokens_buckets(max_model_len)
        self._prompt_len = BatchedHistogram(Histogram(
            "vllm:request_prompt_tokens", "Prompt tokens of each finished request.", labels, buckets=tokens,
            registry=r).labels(model_name))
        self._generated = BatchedHistogram(Histogram(
            "vllm:request_generation_tokens", "Generated tokens of each finished request.", labels, buckets=tokens,
            registry=r).labels(model_name))
        self._max_generated = BatchedHistogram(Histogram(
            "vllm:request_max_num_generation_tokens", "Most tokens generated by one sequence of each finished "
            "request.", labels, buckets=tokens, registry=r).labels(model_name))
        self._max_tokens = BatchedHistogram(Histogram(
            "vllm:request_params_max_tokens", "The max_tokens of each finished request.", labels, buckets=tokens,
            registry=r).labels(model_name))
        self._n = BatchedHistogram(Histogram("vllm:request_params_n", "The n of each finished request.", labels,
                                             buckets=(1, 2, 5, 10, 20), registry=r).labels(model_name))
        self.running = BatchedCounter(Gauge("fleet:requests_in_flight", "This frontend's requests sent to engines "
                                            "and not finished.", labels, registry=r,
                                            multiprocess_mode="livesum").labels(model_name))
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self._finished: dict[str, int] = {}  # finish reason -> requests since the last flush
        self._batched = (self.ttft, self.itl, self.e2e, self.prompt_tokens, self.generation_tokens,
                         self._prompt_len, self._generated, self._max_generated, self._max_tokens, self._n,
                         self.running)
        self._model = model_name
        self.engines_ready = Gauge("fleet:engines_ready", "Engine ranks taking new requests: handshaken, neither "
                                   "slow nor draining (the fewest any API server sees).", labels, registry=r,
                                   multiprocess_mode="livemin").labels(model_name)
        self.engine_streams = Gauge("fleet:engine_streams_open", "This frontend's requests open at each "
                                    "engine rank.", ["model_name", "engine"], registry=r,
                                    multiprocess_mode="livesum")
        # The engine-measured phases of each finished request, per engine rank as in vLLM: observed by the
        # API server that served the request, so with several they add up.
        ranked = ["model_name", "engine"]
        self._phase_families = (
            Histogram("vllm:request_queue_time_seconds", "Time spent in WAITING phase for request.", ranked,
                      buckets=_REQUEST_LATENCY, registry=r),
            Histogram("vllm:request_prefill_time_seconds", "Time spent in PREFILL phase for request.", ranked,
                      buckets=_REQUEST_LATENCY, registry=r),
            Histogram("vllm:request_decode_time_seconds", "Time spent in DECODE phase for request.", ranked,
                      buckets=_REQUEST_LATENCY, registry=r),
            Histogram("vllm:request_inference_time_seconds", "Time spent in RUNNING phase for request.", ranked,
                      buckets=_REQUEST_LATENCY, registry=r),
            Histogram("vllm:request_num_preemptions", "Number of times a request was preempted.", ranked,
                      buckets=_PREEMPTIONS, registry=r),
            # vLLM's per-request mean of the decode phase per token after the first (what its published
            # dashboard's "Time Per Output Token" panel charts), not the per-token inter-token latency.
            Histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds "
                      "per request.", ranked, buckets=_LATENCY, registry=r),
        )
        self._phases: dict[int, tuple[BatchedHistogram, ...]] = {}  # per rank: the families' children
        self._engines: _EngineCollector | None = None

    def finished(self, reason: str) -> None:
        self._finished[reason] = self._finished.get(reason, 0) + 1

    def request_done(self, prompt_len: int, generated: int, max_tokens: int, parent: Parent | None = None) -> None:
        """An engine request's sizes, once it ended (however it ended); `parent`: the request of n
        choices it is one of, whose n and longest choice are observed once, as its last choice ends (vLLM's)."""
        self._prompt_len.observe(prompt_len)
        self._generated.observe(generated)
        self._max_tokens.observe(max_tokens)
        if parent is None:
            self._max_generated.observe(generated)
            self._n.observe(1)
            return
        parent.left -= 1
        parent.longest = max(parent.longest, generated)
        if parent.left == 0:
            self._max_generated.observe(parent.longest)
            self._n.observe(parent.n)

    @staticmethod
    def parent(n: int) -> Parent:
        return Parent(n, n)

    def request_timings(self, rank: int, timings: RequestTimings, decode_time: float | None = None, *,
                        generated: int) -> None:
        """A finished request's phases as engine `rank` measured them, once per request (vLLM's
        definitions: inference = prefill + decode; time per output token = decode / (generated - 1), 0
        with one token or none). `decode_time` stands in for the engine's when the frontend ended the
        request itself (a stop string), before the engine's last figure."""
        children = self._phases.get(rank)
        if children is None:
            engine = str(rank)
            children = self._phases[rank] = tuple(BatchedHistogram(f.labels(self._model, engine))
                                                  for f in self._phase_families)
        queue, prefill, decode, inference, preemptions, per_token = children
        if decode_time is None:
            decode_time = timings.decode_time
        queue.observe(timings.queued_time)
        prefill.observe(timings.prefill_time)
        decode.observe(decode_time)
        inference.observe(timings.prefill_time + decode_time)
        preemptions.observe(timings.num_preemptions)
        per_token.observe(decode_time / (generated - 1) if generated > 1 else 0.0)

    def watch_engines(self, views: Callable[[], Iterable[EngineView]]) -> None:
        """Engine-side figures (vLLM's scheduler and cache metrics, per `engine` rank) read from
        `views` at each scrape: from the answering process, which sees the same Stats as the others."""
        self._engines = _EngineCollector(self._model, views)
        self.registry.register(self._engines)

    def flush(self) -> None:
        """Add the batched observations to their histograms (at each scrape, and every second in each
        API server: with several, another process may answer the next scrape), and at every read of the
        registry."""
        for batched in self._batched:
            batched.flush()
        for children in self._phases.values():
            for child in children:
                child.flush()
        if self._finished:
            finished, self._finished = self._finished, {}
            for reason, n in finished.items():
                self._success.labels(self._model, reason).inc(n)

    def render(self) -> bytes:
        self.flush()
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            every = CollectorRegistry()
            every.register(_WithAliases(multiprocess.MultiProcessCollector(None)))
            if self._engines is not None:
                every.register(self._engines)
            return generate_latest(every)
        return generate_latest(_WithAliases(self.registry))


# vLLM's older names for a family, still what its published dashboard charts: served at scrape time
# from the family itself, so the per-token path observes each interval once.
_ALIASES = {"vllm:inter_token_latency_seconds": ("vllm:time_per_output_token_seconds",
                                                 "Time per output token (inter-token latency; vLLM's older name).")}


class _WithAliases(Collector):
    """Every family of `source`, and a renamed copy of those in _ALIASES."""

    def __init__(self, source: Collector | CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            yield family
            alias = _ALIASES.get(family.name)
            if alias is not None:
                name, documentation = alias
                copy = Metric(name, documentation, family.type)
                copy.samples = [s._replace(name=name + s.name[len(family.name):]) for s in family.samples]
                yield copy


class _EngineCollector(Collector):
    def __init__(self, model_name: str, views: Callable[[], Iterable[EngineView]]) -> None:
        self._model, self._views = model_name, views

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "engine"]
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests in the engine's running batch.",
                                    labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                                    labels=labels)
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 1 is full.", labels=labels)
        usage_old = GaugeMetricFamily("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 is full (vLLM's older "
                                      "name).", labels=labels)
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                      "cache.", labels=labels)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   labels=labels)
        config = GaugeMetricFamily("vllm:cache_config_info", "The engine's KV-cache configuration.",
                                   labels=[*labels, "block_size", "num_gpu_blocks"])
        preemptions = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemption from the "
                                          "engine.", labels=labels)
        steps = HistogramMetricFamily("vllm:iteration_tokens_total", "Histogram of number of tokens per "
                                      "engine_step.", labels=labels)
        for view in self._views():
            key = [self._model, str(view.rank)]
            stats = view.stats
            running.add_metric(key, stats.running if stats is not None else 0)
            waiting.add_metric(key, stats.waiting if stats is not None else 0)
            kv = stats.kv_usage if stats is not None else 0.0
            usage.add_metric(key, kv)
            usage_old.add_metric(key, kv)
            queries.add_metric(key, stats.prefix_cache_queries if stats is not None else 0)
            hits.add_metric(key, stats.prefix_cache_hits if stats is not None else 0)
            if view.block_size:
                config.add_metric([*key, str(view.block_size), str(view.num_kv_blocks)], 1)
            preemptions.add_metric(key, stats.num_preemptions if stats is not None else 0)
            steps.add_metric(key, *_iteration_tokens(stats))
        yield from (running, waiting, usage, usage_old, queries, hits, config, preemptions, steps)


def _iteration_tokens(stats: Stats | None) -> tuple[list[tuple[str, float]], float]:
    """Stats.iteration_tokens as a Prometheus histogram's cumulative buckets, and its sum; nothing
    counted from an engine that does not report them (protocol < 1.4) or reports another bucket count."""
    counts = stats.iteration_tokens if stats is not None else []
    if len(counts) != len(_ITERATION_LE):
        return [(le, 0.0) for le in _ITERATION_LE], 0.0
    buckets, total = [], 0
    for le, n in zip(_ITERATION_LE, counts, strict=True):
        total += n
        buckets.append((le, float(total)))
    assert stats is not None
    return buckets, float(stats.iteration_tokens_sum)
