"""BatchedHistogram and BatchedCounter (services/frontend/generation/metrics.py): observations and increments
counted locally and added at flush give the samples prometheus-client's own observe and inc give, bucket
edges, +Inf and negatives included; /metrics flushes before it renders, and so does every read of the
registry: each per-request figure (all batched) reads as if recorded at once."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from protocol import RequestTimings
from services.frontend.generation.metrics import BatchedCounter, BatchedHistogram, Metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [0.0005, 0.001, 0.0010001, 0.01, 0.05, 0.1, 1.0, 1.5, 1e9, -3.0, 0.0]


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")]


def test_flushed_counts_equal_prometheus_observe() -> None:
    plain_registry, batched_registry = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("h", "h", ["m"], buckets=BUCKETS, registry=plain_registry).labels("x")
    batched = BatchedHistogram(Histogram("h", "h", ["m"], buckets=BUCKETS, registry=batched_registry).labels("x"))
    for value in VALUES:
        plain.observe(value)
        batched.observe(value)
    assert _samples(batched_registry) != _samples(plain_registry)  # nothing added before the flush
    batched.flush()
    assert _samples(batched_registry) == _samples(plain_registry)
    batched.flush()  # a second flush adds nothing
    batched.observe(0.05)
    plain.observe(0.05)
    batched.flush()
    assert _samples(batched_registry) == _samples(plain_registry)


def test_a_scrape_sees_every_observation_before_it() -> None:
    metrics = Metrics("tiny")
    for _ in range(3):
        metrics.itl.observe(0.02)
    text = metrics.render().decode()
    assert 'vllm:inter_token_latency_seconds_count{model_name="tiny"} 3.0' in text
    assert 'vllm:time_per_output_token_seconds_count{model_name="tiny"} 3.0' in text
    assert generate_latest(metrics.registry).decode().count("inter_token_latency_seconds_count") == 1


def test_flushed_counter_and_gauge_equal_prometheus_inc() -> None:
    plain_registry, batched_registry = CollectorRegistry(), CollectorRegistry()
    plain_counter = Counter("c", "c", ["m"], registry=plain_registry).labels("x")
    plain_gauge = Gauge("g", "g", ["m"], registry=plain_registry).labels("x")
    counter = BatchedCounter(Counter("c", "c", ["m"], registry=batched_registry).labels("x"))
    gauge = BatchedCounter(Gauge("g", "g", ["m"], registry=batched_registry).labels("x"))
    for amount in (1, 7, 0, 2.5):
        plain_counter.inc(amount)
        counter.inc(amount)
    for step in (1, 1, -1, 1, -1):
        (plain_gauge.inc if step > 0 else plain_gauge.dec)()
        (gauge.inc if step > 0 else gauge.dec)()
    assert _samples(batched_registry) != _samples(plain_registry)  # nothing added before the flush
    counter.flush()
    gauge.flush()
    assert _samples(batched_registry) == _samples(plain_registry)
    gauge.dec()
    plain_gauge.dec()
    gauge.flush()
    counter.flush()
    assert _samples(batched_registry) == _samples(plain_registry)


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"model_name": "tiny", **labels})


def test_every_per_request_figure_reads_at_once_without_a_flush() -> None:
    """A request's life as output processing and launch record it, read straight from the registry (as
    a test or a scrape of this process reads it), with no flush() called."""
    metrics = Metrics("tiny")
    metrics.running.inc()
    metrics.running.inc()
    metrics.prompt_tokens.inc(5)
    metrics.prompt_tokens.inc(3)
    metrics.ttft.observe(0.03)
    metrics.generation_tokens.inc(4)
    metrics.request_done(5, 4, 16)
    metrics.e2e.observe(0.2)
    metrics.finished("length")
    metrics.request_timings(0, RequestTimings(0.001, 0.02, 0.06, 1), generated=4)
    metrics.running.dec()
    parent = metrics.parent(2)  # a request of two choices: its n and longest choice once, as the last ends
    metrics.request_done(3, 2, 8, parent)
    metrics.finished("stop")
    metrics.request_done(3, 6, 8, parent)
    metrics.finished("stop")
    metrics.request_timings(1, RequestTimings(0.5, 0.5, 2.0, 0), 1.0, generated=6)
    assert _value(metrics, "fleet:requests_in_flight") == 1
    assert _value(metrics, "vllm:prompt_tokens_total") == 8
    assert _value(metrics, "vllm:generation_tokens_total") == 4
    assert _value(metrics, "vllm:time_to_first_token_seconds_count") == 1
    assert _value(metrics, "vllm:time_to_first_token_seconds_bucket", le="0.04") == 1
    assert _value(metrics, "vllm:time_to_first_token_seconds_bucket", le="0.02") == 0
    assert _value(metrics, "vllm:e2e_request_latency_seconds_sum") == 0.2
    assert _value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert _value(metrics, "vllm:request_success_total", finished_reason="stop") == 2
    assert _value(metrics, "vllm:request_prompt_tokens_count") == 3
    assert _value(metrics, "vllm:request_generation_tokens_sum") == 12
    assert _value(metrics, "vllm:request_params_max_tokens_sum") == 32
    assert _value(metrics, "vllm:request_params_n_count") == 2  # the plain request's, and the pair's once
    assert _value(metrics, "vllm:request_params_n_sum") == 3
    assert _value(metrics, "vllm:request_max_num_generation_tokens_sum") == 10  # 4, then the pair's longest: 6
    assert _value(metrics, "vllm:request_queue_time_seconds_sum", engine="0") == 0.001
    assert _value(metrics, "vllm:request_num_preemptions_sum", engine="0") == 1
    assert _value(metrics, "vllm:request_decode_time_seconds_sum", engine="1") == 1.0  # the frontend's figure
    assert _value(metrics, "vllm:request_inference_time_seconds_sum", engine="1") == 1.5
    assert _value(metrics, "vllm:request_time_per_output_token_seconds_sum", engine="1") == 0.2
    # Later figures add to those flushed: nothing counted twice.
    metrics.finished("length")
    metrics.running.dec()
    assert _value(metrics, "vllm:request_success_total", finished_reason="length") == 2
    assert _value(metrics, "fleet:requests_in_flight") == 0
    text = metrics.render().decode()
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 2.0' in text
