"""BatchedHistogram (services/frontend/generation/metrics.py): observations counted locally and added at flush give
the samples prometheus-client's own observe gives, bucket edges, +Inf and negatives included; and
/metrics flushes before it renders."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from services.frontend.generation.metrics import BatchedHistogram, Metrics

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
