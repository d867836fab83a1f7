"""Checks on a GenerateRequest that hold for every backend, so bad input gets a per-request error
instead of reaching the model (an out-of-vocab id would crash a real forward pass)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

from protocol import GenerateRequest, PoolingParams, SamplingParams

# The pooling tasks that take `dimensions` (vLLM's PoolingParams.valid_parameters).
DIMENSIONS_TASKS = ("embed", "token_embed")


def problem(req: GenerateRequest, *, vocab_size: int, max_model_len: int, max_logprobs: int = 20,
            tasks: Sequence[str] = ("generate",)) -> str | None:
    """A message naming the field and the allowed range, or None if the request is acceptable.
    `tasks`: what this engine's model serves (Ready.tasks): a request for another task is refused."""
    ids = req.prompt_token_ids
    if not ids:
        return "prompt_token_ids is empty: at least one token is required"
    wrong_task = task_problem(req.pooling, tasks)
    if wrong_task is not None:
        return wrong_task
    if req.pooling is not None:  # nothing is generated: the prompt may fill the context (vLLM's check)
        if len(ids) > max_model_len:
            return (f"prompt_token_ids has {len(ids)} tokens; this engine's max_model_len is {max_model_len}, "
                    f"so at most {max_model_len} fit")
    elif len(ids) >= max_model_len:
        return (f"prompt_token_ids has {len(ids)} tokens; this engine's max_model_len is "
                f"{max_model_len}, so at most {max_model_len - 1} fit with one generated token")
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = next(i for i in ids if i < 0 or i >= vocab_size)
        return f"prompt_token_ids contains {bad}: token ids must be in [0, {vocab_size})"
    if req.pooling is not None:
        return _pooling_problem(req.pooling, len(ids))  # sampling is ignored: not checked
    s = req.sampling
    floats = {"temperature": s.temperature, "top_p": s.top_p, "min_p": s.min_p,
              "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
              "repetition_penalty": s.repetition_penalty}
    for name, value in floats.items():
        if not math.isfinite(value):
            return f"sampling.{name}={value}: must be a finite number"
    if s.max_tokens < 1:
        return f"sampling.max_tokens={s.max_tokens}: must be >= 1"
    if not 0 <= s.min_tokens <= s.max_tokens:
        return f"sampling.min_tokens={s.min_tokens}: must be in [0, max_tokens={s.max_tokens}]"
    if not 0 <= s.temperature <= 2:
        return f"sampling.temperature={s.temperature}: must be in [0, 2]"
    if not 0 < s.top_p <= 1:
        return f"sampling.top_p={s.top_p}: must be in (0, 1]"
    if not -1 <= s.top_k < 2**31:
        return f"sampling.top_k={s.top_k}: must be -1 or 0 (off) or a positive count below 2**31"
    if not 0 <= s.min_p <= 1:
        return f"sampling.min_p={s.min_p}: must be in [0, 1]"
    for name, count in (("logprobs", s.logprobs), ("prompt_logprobs", s.prompt_logprobs)):
        if count is not None and not 0 <= count <= max_logprobs:
            return f"sampling.{name}={count}: must be in [0, {max_logprobs}] (this engine's --max-logprobs)"
    if not 0 < s.repetition_penalty <= 2:
        return f"sampling.repetition_penalty={s.repetition_penalty}: must be in (0, 2]"
    if not -2 <= s.presence_penalty <= 2 or not -2 <= s.frequency_penalty <= 2:
        return "sampling.presence_penalty and frequency_penalty must be in [-2, 2]"
    if any(t < 0 or t >= vocab_size for t in s.stop_token_ids):
        return f"sampling.stop_token_ids: token ids must be in [0, {vocab_size})"
    return _constraint_problem(s) or _logits_problem(s, vocab_size)


def task_problem(pooling: PoolingParams | None, tasks: Sequence[str]) -> str | None:
    """A request for a task the model does not serve, as vLLM refuses one: naming the task and those served."""
    if pooling is None:
        if "generate" in tasks:
            return None
        return (f"task 'generate' is not served: this engine runs a pooling model (tasks {list(tasks)}); "
                "send a pooling request (GenerateRequest.pooling) for one of them")
    if pooling.task in tasks and pooling.task != "generate":
        return None
    return f"pooling.task={pooling.task!r} is not served by this engine's model: it serves {list(tasks)}"


def _pooling_problem(p: PoolingParams, num_tokens: int) -> str | None:
    """The shape of a pooling request's parameters; what the model supports (matryoshka sizes) is the backend's."""
    if p.dimensions is not None:
        if p.task not in DIMENSIONS_TASKS:
            return (f"pooling.dimensions={p.dimensions}: task {p.task!r} does not take it (only "
                    f"{' and '.join(DIMENSIONS_TASKS)} do)")
        if p.dimensions < 1:
            return f"pooling.dimensions={p.dimensions}: must be >= 1"
    split = p.token_type_split
    # vLLM's compressed_token_type_ids: the first token of type 1, the length when none is (a pair whose
    # second text was cut away).
    if split is not None and not 0 <= split <= num_tokens:
        return (f"pooling.token_type_split={split}: must be in [0, {num_tokens}] (the index of the second "
                f"text's first token among the prompt's {num_tokens}, {num_tokens} when it has none)")
    return None


def constraints(s: SamplingParams) -> list[str]:
    """The structured-output constraints a request sets, by SamplingParams field name."""
    given = [name for name in ("json_schema", "regex", "choice", "grammar", "structural_tag")
             if getattr(s, name) is not None]
    return given + ["json_object"] if s.json_object else given


def _constraint_problem(s: SamplingParams) -> str | None:
    """The shapes every structured-output backend needs; whether a grammar compiles is the backend's."""
    given = constraints(s)
    if len(given) > 1:
        return (f"sampling.{given[1]}: only one structured-output constraint per request, and "
                f"sampling.{given[0]} is set too")
    for name in ("json_schema", "structural_tag"):
        text = getattr(s, name)
        if text is not None:
            try:
                value = json.loads(text)
            except ValueError as exc:
                return f"sampling.{name}: not valid JSON ({exc})"
            if not isinstance(value, dict):
                return f"sampling.{name}: must be a JSON object" + (" (a JSON Schema)" if name == "json_schema" else "")
    if s.choice is not None and not s.choice:
        return "sampling.choice: must list at least one string"
    if s.grammar is not None and not s.grammar.strip():
        return "sampling.grammar: must not be empty"
    if s.regex is not None and "\x00" in s.regex:
        return "sampling.regex: must not contain a NUL character"
    return None


def _logits_problem(s: SamplingParams, vocab_size: int) -> str | None:
    if s.logit_bias is not None:
        for token, bias in s.logit_bias.items():
            if not 0 <= token < vocab_size:
                return f"sampling.logit_bias: token id {token} is out of range: token ids must be in [0, {vocab_size})"
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                return f"sampling.logit_bias: the bias of token {token} is {bias}: must be in [-100, 100]"
    if s.allowed_token_ids is not None:
        if not s.allowed_token_ids:
            return "sampling.allowed_token_ids: must list at least one token id"
        if min(s.allowed_token_ids) < 0 or max(s.allowed_token_ids) >= vocab_size:
            bad = next(t for t in s.allowed_token_ids if not 0 <= t < vocab_size)
            return (f"sampling.allowed_token_ids: token id {bad} is out of range: token ids must be in "
                    f"[0, {vocab_size})")
    if not all(word.strip() for word in s.bad_words):
        return "sampling.bad_words: an entry is empty or only whitespace"
    return None
