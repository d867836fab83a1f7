"""The engine-side figures /metrics serves from each rank's latest Stats (protocol 1.4: preemptions and
the tokens-per-step histogram), read with prometheus-client's own parser as a scraper reads them."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from protocol import ITERATION_TOKENS_BUCKETS, RequestTimings, Stats
from services.frontend.generation.metrics import EngineView, Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}


def _stats(rank: int, **fields: object) -> Stats:
    return Stats(rank, 1, 0.0, 0, 0, 0.0, session_epoch="e", **fields)  # type: ignore[arg-type]


def test_preemptions_and_iteration_tokens_per_rank_from_the_latest_stats() -> None:
    counts = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
    counts[0], counts[3], counts[-1] = 5, 2, 1  # 5 steps of 1 token, 2 of 17..32, 1 above 16384
    views = [EngineView(0, _stats(0, num_preemptions=3, iteration_tokens=counts, iteration_tokens_sum=20065), 16, 64),
             EngineView(1, _stats(1), 16, 64),  # an engine of protocol 1.3: no counts
             EngineView(2, None, 0, 0)]  # not handshaken yet
    metrics = Metrics("tiny")
    metrics.watch_engines(lambda: views)
    got = _samples(metrics)

    def at(name: str, rank: int, **labels: str) -> float:
        return got[(name, tuple(sorted({"model_name": "tiny", "engine": str(rank), **labels}.items())))]

    assert [at("vllm:num_preemptions_total", r) for r in (0, 1, 2)] == [3, 0, 0]
    buckets = [at("vllm:iteration_tokens_total_bucket", 0, le=le) for le in ("1.0", "16.0", "32.0", "16384.0", "+Inf")]
    assert buckets == [5, 5, 7, 7, 8]  # cumulative, as Prometheus' `le`
    assert (at("vllm:iteration_tokens_total_count", 0), at("vllm:iteration_tokens_total_sum", 0)) == (8, 20065)
    for rank in (1, 2):
        assert (at("vllm:iteration_tokens_total_count", rank), at("vllm:iteration_tokens_total_sum", rank)) == (0, 0)


def test_time_per_output_token_is_each_requests_decode_time_over_its_tokens_after_the_first() -> None:
    """vLLM's vllm:request_time_per_output_token_seconds (its dashboard's TPOT panel): one observation per
    finished request, decode / (generated - 1), and 0 for a request of one token, in the rank's series."""
    metrics = Metrics("tiny")
    metrics.request_timings(1, RequestTimings(0.0, 0.1, 0.9, 0), generated=10)  # 0.1 s a token
    metrics.request_timings(1, RequestTimings(0.0, 0.1, 0.0, 0), generated=1)
    metrics.request_timings(1, RequestTimings(0.0, 0.1, 2.0, 0), 0.3, generated=4)  # the frontend's decode time
    got = _samples(metrics)
    key = (("engine", "1"), ("model_name", "tiny"))
    assert got[("vllm:request_time_per_output_token_seconds_count", key)] == 3
    assert abs(got[("vllm:request_time_per_output_token_seconds_sum", key)] - 0.2) < 1e-9
    assert got[("vllm:request_time_per_output_token_seconds_bucket", (*key[:1], ("le", "0.001"), key[1]))] == 1
