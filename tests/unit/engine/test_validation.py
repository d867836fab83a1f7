from __future__ import annotations

import pytest

from protocol import GenerateRequest, SamplingParams
from services.engine.validation import problem


def _check(prompt: list[int] | None = None, **sampling: object) -> str | None:
    sampling.setdefault("max_tokens", 8)
    req = GenerateRequest("r", [1, 2, 3] if prompt is None else prompt, SamplingParams(**sampling), 0.0)  # type: ignore[arg-type]
    return problem(req, vocab_size=100, max_model_len=32)


def test_good_request_passes() -> None:
    assert _check() is None
    assert _check(top_k=-1, temperature=0.0, logprobs=20) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": []}, "prompt_token_ids is empty"),
        ({"prompt": list(range(32))}, "32 tokens; this engine's max_model_len is 32, so at most 31"),
        ({"prompt": [1, 100]}, "contains 100: token ids must be in [0, 100)"),
        ({"prompt": [-1]}, "contains -1"),
        ({"max_tokens": 0}, "sampling.max_tokens=0: must be >= 1"),
        ({"min_tokens": 9}, "sampling.min_tokens=9: must be in [0, max_tokens=8]"),
        ({"temperature": -0.1}, "sampling.temperature=-0.1"),
        ({"top_p": 0.0}, "sampling.top_p=0.0: must be in (0, 1]"),
        ({"top_k": -2}, "sampling.top_k=-2"),
        ({"min_p": 1.5}, "sampling.min_p=1.5"),
        ({"logprobs": 21}, "sampling.logprobs=21: must be in [0, 20] (this engine's --max-logprobs)"),
        ({"prompt_logprobs": -1}, "sampling.prompt_logprobs=-1: must be in [0, 20]"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"stop_token_ids": [100]}, "sampling.stop_token_ids"),
    ],
)
def test_each_problem_names_field_and_range(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    result = _check(**kwargs)
    assert result is not None and message in result


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "presence_penalty"])
def test_non_finite_floats_are_refused(field: str) -> None:
    result = _check(**{field: float("nan")})
    assert result is not None and f"sampling.{field}=nan: must be a finite number" in result


def test_values_vllm_refuses_are_caught_here_first() -> None:
    assert "must be in [0, 2]" in (_check(temperature=2.5) or "")
    assert "below 2**31" in (_check(top_k=2**40) or "")
    assert "(0, 2]" in (_check(repetition_penalty=3.0) or "")


def test_a_json_schema_must_be_a_json_object() -> None:
    assert _check(json_schema='{"type": "object"}') is None
    assert "sampling.json_schema: not valid JSON" in (_check(json_schema="{'type': 1}") or "")
    assert _check(json_schema="[1]") == "sampling.json_schema: must be a JSON Schema object"
