from __future__ import annotations

import pytest

from protocol import GenerateRequest, PoolingParams, SamplingParams
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
    assert _check(json_schema="[1]") == "sampling.json_schema: must be a JSON object (a JSON Schema)"


@pytest.mark.parametrize("constraint", [{"json_schema": '{"type": "object"}'}, {"regex": "[a-z]+"},
                                        {"choice": ["yes", "no"]}, {"grammar": 'root ::= "a"'},
                                        {"json_object": True}, {"structural_tag": '{"type": "structural_tag"}'}])
def test_each_structured_output_constraint_alone_passes(constraint: dict[str, object]) -> None:
    assert _check(**constraint) is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"regex": "a", "choice": ["a"]}, "sampling.choice: only one structured-output constraint per request, and "
                                      "sampling.regex is set too"),
    ({"json_schema": "{}", "json_object": True}, "sampling.json_object: only one"),
    ({"structural_tag": "{x"}, "sampling.structural_tag: not valid JSON"),
    ({"structural_tag": '"tag"'}, "sampling.structural_tag: must be a JSON object"),
    ({"choice": []}, "sampling.choice: must list at least one string"),
    ({"grammar": " \n"}, "sampling.grammar: must not be empty"),
    ({"regex": "a\x00"}, "sampling.regex: must not contain a NUL character"),
    ({"logit_bias": {100: 1.0}}, "sampling.logit_bias: token id 100 is out of range: token ids must be in [0, 100)"),
    ({"logit_bias": {-1: 1.0}}, "sampling.logit_bias: token id -1"),
    ({"logit_bias": {5: 100.5}}, "sampling.logit_bias: the bias of token 5 is 100.5: must be in [-100, 100]"),
    ({"logit_bias": {5: float("nan")}}, "sampling.logit_bias: the bias of token 5 is nan"),
    ({"allowed_token_ids": []}, "sampling.allowed_token_ids: must list at least one token id"),
    ({"allowed_token_ids": [3, 100]}, "sampling.allowed_token_ids: token id 100 is out of range: token ids must "
                                      "be in [0, 100)"),
    ({"bad_words": ["ok", " "]}, "sampling.bad_words: an entry is empty or only whitespace"),
])
def test_structured_output_and_logits_controls_problems_name_the_field(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    result = _check(**kwargs)
    assert result is not None and message in result, result


def test_logits_controls_in_range_pass() -> None:
    assert _check(logit_bias={0: -100.0, 99: 100.0}, allowed_token_ids=[0, 99], bad_words=["x", " y"]) is None


def _pooling(task: str = "embed", prompt: list[int] | None = None, tasks: tuple[str, ...] = ("embed", "token_embed"),
             **params: object) -> str | None:
    req = GenerateRequest("r", [1, 2, 3] if prompt is None else prompt, SamplingParams(max_tokens=1), 0.0,
                          pooling=PoolingParams(task, **params))  # type: ignore[arg-type]
    return problem(req, vocab_size=100, max_model_len=32, tasks=tasks)


def test_a_pooling_request_for_a_served_task_passes_and_may_fill_the_context() -> None:
    assert _pooling() is None
    assert _pooling(prompt=list(range(32))) is None
    assert _pooling(task="token_embed", dimensions=4) is None
    assert _pooling(token_type_split=3) is None  # no token of type 1 (the second text cut away): vLLM's length


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "classify"}, "pooling.task='classify' is not served by this engine's model: it serves "
                               "['embed', 'token_embed']"),
        ({"task": "generate", "tasks": ("generate",)}, "pooling.task='generate' is not served"),
        ({"tasks": ("generate",)}, "pooling.task='embed' is not served by this engine's model: it serves ['generate']"),
        ({"prompt": list(range(33))}, "33 tokens; this engine's max_model_len is 32, so at most 32 fit"),
        ({"prompt": [1, 100]}, "contains 100: token ids must be in [0, 100)"),
        ({"dimensions": 0}, "pooling.dimensions=0: must be >= 1"),
        ({"task": "classify", "tasks": ("classify",), "dimensions": 8},
         "pooling.dimensions=8: task 'classify' does not take it (only embed and token_embed do)"),
        ({"token_type_split": 4}, "pooling.token_type_split=4: must be in [0, 3]"),
        ({"token_type_split": -1}, "pooling.token_type_split=-1: must be in [0, 3]"),
    ],
)
def test_each_pooling_problem_names_field_and_allowed_values(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    got = _pooling(**kwargs)
    assert got is not None and message in got


def test_generation_on_a_pooling_engine_names_the_task_and_the_tasks_served() -> None:
    req = GenerateRequest("r", [1, 2, 3], SamplingParams(max_tokens=8), 0.0)
    got = problem(req, vocab_size=100, max_model_len=32, tasks=("embed", "token_embed"))
    assert got is not None and "task 'generate' is not served" in got and "['embed', 'token_embed']" in got
