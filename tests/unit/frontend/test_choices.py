"""A request's choices (engine_request.EngineRequest.choices) and their metrics (vLLM's per-request n and
longest choice, observed once the last choice ends)."""
from __future__ import annotations

from prometheus_client import generate_latest

from protocol import GenerateRequest, SamplingParams
from services.frontend.generation.metrics import Metrics
from services.frontend.requests.engine_request import EngineRequest, OutputOptions

OPTIONS = OutputOptions(chat=True, stream=False, include_usage=False, continuous_usage=False, stop=(),
                        include_stop_str_in_output=False, skip_special_tokens=True)


def _request(n: int, seed: int | None) -> EngineRequest:
    sampling = SamplingParams(max_tokens=4, seed=seed)
    return EngineRequest(GenerateRequest("chatcmpl-1", [1, 2, 3], sampling, 0.0), 4, OPTIONS, n)


def test_one_choice_is_the_request_itself() -> None:
    request = _request(1, 7)
    assert request.choices() == [request]


def test_each_choice_is_an_engine_request_seeded_as_vllm_seeds_it() -> None:
    choices = _request(3, 7).choices()
    assert [c.request_id for c in choices] == ["chatcmpl-1-0", "chatcmpl-1-1", "chatcmpl-1-2"]
    assert [c.request.sampling.seed for c in choices] == [7, 8, 9]
    assert all(c.request.prompt_token_ids == [1, 2, 3] and c.n == 1 for c in choices)
    assert [c.request.sampling.seed for c in _request(2, None).choices()] == [None, None]
    # The largest seed allowed wraps, staying a 64-bit integer the engines take.
    assert [c.request.sampling.seed for c in _request(2, 2**63 - 1).choices()] == [2**63 - 1, -(2**63)]


def _sample(metrics: Metrics, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_n_and_the_longest_choice_are_observed_once_per_request() -> None:
    metrics = Metrics("tiny")
    parent = metrics.parent(3)
    for generated in (5, 9, 2):
        metrics.request_done(10, generated, 16, parent)
    metrics.request_done(10, 4, 16)  # a one-choice request
    assert _sample(metrics, "vllm:request_params_n_count") == 2
    assert _sample(metrics, "vllm:request_params_n_sum") == 3 + 1
    assert _sample(metrics, "vllm:request_max_num_generation_tokens_sum") == 9 + 4
    assert _sample(metrics, "vllm:request_generation_tokens_count") == 4  # every engine request
