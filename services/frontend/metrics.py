"""Prometheus metrics under vLLM's names, in a registry owned by this process. With several API
server processes (`--api-server-count`), prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR,
set by the CLI before the import) makes one /metrics of all of them: counters and histograms add up,
and each gauge says how its processes' values combine."""
from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0)


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_LATENCY, registry=r).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens.", labels,
                             buckets=_LATENCY, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                             buckets=_LATENCY, registry=r).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", labels,
                                         registry=r).labels(model_name)
        self.running = Gauge("vllm:num_requests_running", "Requests in flight at the engines.", labels,
                             registry=r, multiprocess_mode="livesum").labels(model_name)
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self._model = model_name
        self.engines_ready = Gauge("fleet:engines_ready", "Engine ranks handshaken and alive (the fewest "
                                   "any API server sees).", labels, registry=r,
                                   multiprocess_mode="livemin").labels(model_name)
        # Set at scrape time (Frontend._metrics): what each rank holds, by its Stats and by our count.
        ranked = ["model_name", "rank"]
        self.engine_running = Gauge("fleet:engine_requests_running", "Requests running at each engine rank, "
                                    "as its latest Stats says (all frontends' requests).", ranked, registry=r,
                                    multiprocess_mode="livemostrecent")
        self.engine_waiting = Gauge("fleet:engine_requests_waiting", "Requests waiting at each engine rank, "
                                    "as its latest Stats says.", ranked, registry=r,
                                    multiprocess_mode="livemostrecent")
        self.engine_streams = Gauge("fleet:engine_streams_open", "This frontend's requests open at each "
                                    "engine rank.", ranked, registry=r, multiprocess_mode="livesum")

    def finished(self, reason: str) -> None:
        self._success.labels(self._model, reason).inc()

    def render(self) -> bytes:
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            every = CollectorRegistry()
            multiprocess.MultiProcessCollector(every)
            return generate_latest(every)
        return generate_latest(self.registry)
