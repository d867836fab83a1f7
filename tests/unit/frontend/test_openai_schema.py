from __future__ import annotations

import json

import pytest

from services.frontend.errors import APIError
from services.frontend.requests.json_body import parse
from services.frontend.requests.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    check_common,
    sampling_params,
)
from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS


def _err(cls: type, body: bytes) -> APIError:
    with pytest.raises(APIError) as info:
        req = parse(cls, body)
        check_common(req)
        sampling_params(req, 16, 1000)
    return info.value


def test_parses_a_full_chat_request() -> None:
    req = parse(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                                       b'"temperature": 0.5, "stop": "x"}')
    check_common(req)
    params = sampling_params(req, 16, 1000)
    assert (params.temperature, params.max_tokens, req.stop) == (0.5, 16, "x")


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        (b"", None, "empty"),
        (b"{", None, "not valid JSON"),
        (b"7", None, "JSON object"),
        (b'{"messages": []}', "model", "model: this field is required"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role", "required"),
        (b'{"model": "m", "messages": [], "n": 0}', "n", "must be >= 1"),
        (b'{"model": "m", "messages": [], "top_k": -5}', "top_k", "-1 or 0"),
        (b'{"model": "m", "messages": [], "presence_penalty": 3}', "presence_penalty", "[-2, 2]"),
        (b'{"model": "m", "messages": [], "stop": ["a", ""]}', "stop", "must not be empty"),
        (b'{"model": "m", "messages": [], "stop_token_ids": [5, 5000]}', "stop_token_ids[1]", "[0, 1000)"),
        (b'{"model": "m", "messages": [], "min_tokens": 20}', "min_tokens", "<= max_tokens (16)"),
        (b'{"model": "m", "messages": [], "seed": "x"}', "seed", "expected `int | null`, got `str`"),
        # Refused, not ignored (vLLM logs a warning): a misspelt field would silently change the answer.
        (b'{"model": "m", "messages": [], "respone_format": {"type": "json_object"}}', "respone_format",
         "respone_format: unknown field: it is neither OpenAI's nor vLLM's"),
        (b'{"model": "m", "messages": [], "stream_options": {"include_usage": true, "x": 1}}', "stream_options.x",
         "unknown field"),
        (b'{"model": "m", "messages": [], "response_format": {"type": "json_schema", "json_schema": '
         b'{"name": "n", "schema": {}, "strictly": true}}}', "response_format.json_schema.strictly", "unknown field"),
        (b'{"model": "m", "messages": [], "response_format": {"type": "xml"}}', "response_format.type",
         "invalid value 'xml'"),
        (b'{"model": "m", "messages": [], "structured_outputs": {"pattern": "a"}}', "structured_outputs.pattern",
         "unknown field"),
        (b'{"model": "m", "messages": [], "logit_bias": {"5": "high"}}', "logit_bias[...]", "expected `float`"),
        (b'{"model": "m", "messages": [], "logit_bias": {"x": 1}}', "logit_bias", "key 'x' is not a token id"),
        (b'{"model": "m", "messages": [], "logit_bias": {"5000": 1}}', "logit_bias", "out of range [0, 1000)"),
        (b'{"model": "m", "messages": [], "logit_bias": {"5": 101}}', "logit_bias", "must be in [-100, 100]"),
        (b'{"model": "m", "messages": [], "allowed_token_ids": []}', "allowed_token_ids", "at least one"),
        (b'{"model": "m", "messages": [], "allowed_token_ids": [1, -1]}', "allowed_token_ids[1]", "[0, 1000)"),
        (b'{"model": "m", "messages": [], "bad_words": ["a", " "]}', "bad_words[1]", "empty or only whitespace"),
        (b'{"model": "m", "messages": [], "truncate_prompt_tokens": -2}', "truncate_prompt_tokens", "-1"),
        (b'{"model": "m", "messages": [], "tools": ' + b"[" * 1000 + b"]" * 1000 + b"}", None,
         "nests too deeply: arrays and objects may nest 64 levels at most"),
    ],
)
def test_errors_name_the_field(body: bytes, param: str | None, needle: str) -> None:
    err = _err(ChatCompletionRequest, body)
    assert err.status == 400 and err.param == param and needle in err.message


def test_stop_limits_are_a_400_naming_stop_and_the_limit() -> None:
    def body(stop: object) -> bytes:
        return json.dumps({"model": "m", "messages": [], "stop": stop}).encode()

    at_limit = ["x" * (MAX_STOP_CHARS // MAX_STOP_STRINGS)] * MAX_STOP_STRINGS
    check_common(parse(ChatCompletionRequest, body(at_limit)))
    check_common(parse(ChatCompletionRequest, body("y" * MAX_STOP_CHARS)))  # one string may take it all
    err = _err(ChatCompletionRequest, body(["s"] * (MAX_STOP_STRINGS + 1)))
    assert (err.param, err.message) == ("stop", f"stop: {MAX_STOP_STRINGS + 1} stop strings, at most "
                                                f"{MAX_STOP_STRINGS} are allowed")
    over = [*at_limit[1:], "z" * 300]
    err = _err(CompletionRequest, json.dumps({"model": "m", "prompt": "p", "stop": over}).encode())
    total = sum(map(len, over))
    assert (err.param, err.message) == ("stop", f"stop: {total} characters in all, at most {MAX_STOP_CHARS} "
                                                "are allowed")


def test_completion_prompt_forms() -> None:
    assert parse(CompletionRequest, b'{"model": "m", "prompt": [1, 2]}').prompt == [1, 2]
    assert parse(CompletionRequest, b'{"model": "m", "prompt": ["a"]}').prompt == ["a"]
    assert _err(CompletionRequest, b'{"model": "m", "prompt": 5}').param == "prompt"
