"""The rule of docs/request-fields.md held to the code: every field of OpenAI's chat and completion
requests (the openai SDK's request types) is declared by openai_schema.py, every declared field is in the
table with its endpoints, and each, sent with a value that asks for something, is answered as the
table says, in process through the frontend's ASGI app over a fake engine: honoured (200), honoured
on vllm engines and a 400 naming it on sim ones, honoured on completions and a 400 naming it on chat,
or a 400 naming it everywhere. None is ignored.
(tests/vllm/test_request_fields_vllm.py holds the table to vLLM's own request types.)"""
from __future__ import annotations

import asyncio
import re
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from protocol import MAJOR, MINOR
from services.frontend.http_api.app import Frontend
from services.frontend.requests import refusals
from services.frontend.requests.openai_schema import ChatCompletionRequest, CompletionRequest
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import frontend_app

TABLE = Path(__file__).parents[3] / "docs" / "request-fields.md"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BASES: dict[str, dict[str, Any]] = {CHAT: {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                                    COMPLETIONS: {"model": "tiny", "prompt": "hi"}}
ANSWERS = ("honoured", "honoured (vllm)", "honoured (completions)", "annotation", "refused (not yet)", "refused")


def table() -> dict[str, tuple[str, str]]:
    """field -> (endpoints, answer), from the docs table's rows."""
    rows: dict[str, tuple[str, str]] = {}
    for line in TABLE.read_text().splitlines():
        m = re.match(r"\| `(?P<field>\w+)` \| (?P<endpoints>\w+) \| [^|]+ \| (?P<answer>[^|]+?) \|", line)
        if m:
            assert m["field"] not in rows, f"{m['field']} is in the table twice"
            rows[m["field"]] = (m["endpoints"], m["answer"])
    return rows


TABLE_ROWS = table()


def fields(cls: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(cls)}


def test_the_table_lists_every_declared_field_with_its_endpoints_and_a_known_answer() -> None:
    chat, completion = fields(ChatCompletionRequest), fields(CompletionRequest)
    assert set(TABLE_ROWS) == chat | completion
    for name, (endpoints, answer) in TABLE_ROWS.items():
        expected = "both" if name in chat and name in completion else "chat" if name in chat else "completions"
        assert endpoints == expected, name
        assert answer in ANSWERS, (name, answer)


def test_every_field_of_the_openai_sdk_requests_is_declared() -> None:
    chat_sdk = set(typing.get_type_hints(chat_create_params.CompletionCreateParamsStreaming))
    completion_sdk = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsStreaming))
    assert chat_sdk - fields(ChatCompletionRequest) == set()
    assert completion_sdk - fields(CompletionRequest) == set()


def test_refused_rows_are_the_fields_refusals_refuses() -> None:
    refused = {name for name, (_, answer) in TABLE_ROWS.items() if answer.startswith("refused")}
    on_chat = {name for name, (_, answer) in TABLE_ROWS.items() if answer == "honoured (completions)"}
    tables = set(refusals.COMMON) | set(refusals.CHAT) | set(refusals.COMPLETION)
    # spaces_between_special_tokens: refused with skip_special_tokens false only.
    assert refused | on_chat == tables | {"spaces_between_special_tokens"}
    assert on_chat <= set(refusals.CHAT) - set(refusals.COMMON) - set(refusals.COMPLETION)


# For each field, a value that asks for something (with what it needs beside it).
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
EXAMPLES: dict[str, dict[str, Any]] = {
    "model": {"model": "tiny"},
    "messages": {"messages": [{"role": "user", "content": "hello"}]},
    "prompt": {"prompt": [[1, 2, 3], "hi"]},  # a batch
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "max_tokens": {"max_tokens": 1},
    "max_completion_tokens": {"max_completion_tokens": 1},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.5},
    "seed": {"seed": 7},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "stop": {"stop": ["x"]},
    "n": {"n": 2},
    "logprobs": {"logprobs": True},  # completions: replaced by an int below
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "echo": {"echo": True},
    "suffix": {"suffix": "x"},
    "best_of": {"best_of": 2, "n": 2},
    "logit_bias": {"logit_bias": {"9707": 5}},
    "response_format": {"response_format": {"type": "json_object"}},
    "user": {"user": "u-1"},
    "tools": {"tools": [TOOL], "tool_choice": "none"},
    "tool_choice": {"tools": [TOOL], "tool_choice": "required"},
    "parallel_tool_calls": {"parallel_tool_calls": False},
    "reasoning_effort": {"reasoning_effort": "low"},
    "audio": {"audio": {"voice": "alloy", "format": "wav"}},
    "modalities": {"modalities": ["text", "audio"]},
    "function_call": {"function_call": "auto"},
    "functions": {"functions": [{"name": "f"}]},
    "moderation": {"moderation": {"mode": "block"}},
    "prediction": {"prediction": {"type": "content", "content": "x"}},
    "prompt_cache_options": {"prompt_cache_options": {"ttl": "1h"}},
    "prompt_cache_retention": {"prompt_cache_retention": "24h"},
    "service_tier": {"service_tier": "flex"},
    "store": {"store": True},
    "verbosity": {"verbosity": "low"},
    "web_search_options": {"web_search_options": {}},
    "metadata": {"metadata": {"team": "a"}},
    "prompt_cache_key": {"prompt_cache_key": "k"},
    "safety_identifier": {"safety_identifier": "s"},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "stop_token_ids": {"stop_token_ids": [5]},
    "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "ignore_eos": {"ignore_eos": True},
    "min_tokens": {"min_tokens": 1, "max_tokens": 2},
    "skip_special_tokens": {"skip_special_tokens": False},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": False, "skip_special_tokens": False},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 2},
    "truncation_side": {"truncate_prompt_tokens": 2, "truncation_side": "right"},
    "allowed_token_ids": {"allowed_token_ids": [9707, 11]},
    "bad_words": {"bad_words": ["hello"]},
    "structured_outputs": {"structured_outputs": {"regex": "[a-z]+"}},
    "add_special_tokens": {"add_special_tokens": True},
    "add_generation_prompt": {"add_generation_prompt": False},
    "continue_final_message": {"add_generation_prompt": False, "continue_final_message": True},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
    "documents": {"documents": [{"title": "t", "text": "x"}]},
    "priority": {"priority": 1},
    "cache_salt": {"cache_salt": "salt"},
    "session_id": {"session_id": "s"},
    "chat_template": {"chat_template": "{{ messages }}"},
    "use_beam_search": {"use_beam_search": True},
    "length_penalty": {"length_penalty": 0.5},
    "watermarking": {"watermarking": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "logprob_token_ids": {"logprob_token_ids": [5]},
    "return_tokens_as_token_ids": {"return_tokens_as_token_ids": True},
    "return_token_ids": {"return_token_ids": True},
    "return_prompt_text": {"return_prompt_text": True},
    "include_reasoning": {"include_reasoning": False},
    "request_id": {"request_id": "mine"},  # its answer: test_request_id_names_the_response
    "routed_experts_prompt_start": {"routed_experts_prompt_start": 1},
    "return_token_offsets": {"return_token_offsets": True},
    "mm_payload": {"mm_payload": "none"},
    "return_mm_kwargs": {"return_mm_kwargs": False},
    "media_io_kwargs": {"media_io_kwargs": {"image": {}}},
    "mm_processor_kwargs": {"mm_processor_kwargs": {}},
    "prompt_embeds": {"prompt_embeds": "AAAA"},
    "kv_transfer_params": {"kv_transfer_params": {}},
    "ec_transfer_params": {"ec_transfer_params": {}},
    "vllm_xargs": {"vllm_xargs": {"a": 1}},
    "repetition_detection": {"repetition_detection": {"max_pattern_size": 4}},
    "thinking_token_budget": {"thinking_token_budget": 10},
    "stream_interval": {"stream_interval": 4},
    "guided_json": {"guided_json": SCHEMA},
    "guided_regex": {"guided_regex": "[0-9]+"},
    "guided_choice": {"guided_choice": ["yes", "no"]},
    "guided_grammar": {"guided_grammar": 'root ::= "yes" | "no"'},
    "structural_tag": {"structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", '
                                         '"value": "x"}}'},
    "guided_decoding_backend": {"guided_decoding_backend": "xgrammar"},
    "guided_whitespace_pattern": {"guided_whitespace_pattern": " *"},
}
COMPLETION_EXAMPLES = {"logprobs": {"logprobs": 2}}


def test_every_field_has_an_example() -> None:
    assert set(EXAMPLES) == set(TABLE_ROWS)


@pytest.fixture(scope="module")
def sim() -> Frontend:
    return frontend_app()


@pytest.fixture(scope="module")
def vllm() -> Frontend:
    return frontend_app(backend="vllm", minor=3)


def _answer(app: Frontend, path: str, field: str) -> Answer:
    example = COMPLETION_EXAMPLES.get(field, EXAMPLES[field]) if path == COMPLETIONS else EXAMPLES[field]
    body = {**BASES[path], "max_tokens": 1, **example}
    return asyncio.run(request(app, "POST", path, body))


CASES = [(path, name) for name, (endpoints, _) in TABLE_ROWS.items() for path in (CHAT, COMPLETIONS)
         if endpoints == "both" or (endpoints == "chat") == (path == CHAT)]


@pytest.mark.parametrize(("path", "field"), CASES,
                         ids=[f"{'chat' if p == CHAT else 'completions'}:{f}" for p, f in CASES])
def test_each_field_is_answered_as_the_table_says(sim: Frontend, vllm: Frontend, path: str, field: str) -> None:
    answer = TABLE_ROWS[field][1]
    if answer == "honoured (completions)":
        answer = "honoured" if path == COMPLETIONS else "refused (not yet)"
    for app, backend in ((vllm, "vllm"), (sim, "sim")):
        got = _answer(app, path, field)
        if answer in ("honoured", "annotation") or (answer == "honoured (vllm)" and backend == "vllm"):
            assert got.status == 200, (backend, got.body)
        else:
            assert got.status == 400, (backend, got.body)
            error = got.json()["error"]
            # The field, or the part of it at fault (structured_outputs.regex).
            assert error["param"] in (field, *_parts(error["param"], field)), (backend, error)
            assert error["message"].startswith(error["param"]), (backend, error)
            if answer == "honoured (vllm)":
                # The sim engine of this checkout speaks the current protocol version.
                assert re.search(rf"engine rank 0 cannot \(its sim backend, protocol {MAJOR}\.{MINOR}; the vllm "
                                 r"backend with protocol 1\.[23] or newer can\)", error["message"]), error


def _parts(param: str, field: str) -> tuple[str, ...]:
    return (param,) if param.startswith(field + ".") else ()


def test_a_vllm_engine_older_than_protocol_1_3_gets_the_new_fields_refused() -> None:
    old = frontend_app(backend="vllm", minor=2)
    for field in ("logit_bias", "allowed_token_ids", "bad_words", "guided_regex", "structured_outputs"):
        got = asyncio.run(request(old, "POST", CHAT, {**BASES[CHAT], **EXAMPLES[field]}))
        error = got.json()["error"]
        assert got.status == 400 and error["param"] in (field, *_parts(error["param"], field)), error
        assert "its vllm backend, protocol 1.2; the vllm backend with protocol 1.3 or newer can" in error["message"]
    # A forced tool_choice needs 1.2 only.
    got = asyncio.run(request(old, "POST", CHAT, {**BASES[CHAT], **EXAMPLES["tool_choice"]}))
    assert got.status == 200, got.body


def test_request_id_names_the_response_as_vllm_does(sim: Frontend) -> None:
    for path, prefix in ((CHAT, "chatcmpl-"), (COMPLETIONS, "cmpl-")):
        for stream in (False, True):
            got = asyncio.run(request(sim, "POST", path, {**BASES[path], "max_tokens": 1, "stream": stream,
                                                         "request_id": "mine-7"}))
            assert got.status == 200 and f'"id":"{prefix}mine-7"'.encode() in got.body, got.body
    rendered = asyncio.run(request(sim, "POST", CHAT + "/render", {**BASES[CHAT], "request_id": "mine-7"}))
    assert rendered.json()["request_id"] == "chatcmpl-mine-7"


def test_logprobs_need_engines_of_protocol_1_3_of_either_backend() -> None:
    for backend in ("sim", "vllm"):
        old = frontend_app(backend=backend, minor=2)
        for path, example, param in ((CHAT, {"logprobs": True}, "top_logprobs"),
                                     (COMPLETIONS, {"logprobs": 2}, "logprobs"),
                                     (CHAT, {"prompt_logprobs": 1}, "prompt_logprobs"),
                                     (COMPLETIONS, {"prompt_logprobs": 1}, "prompt_logprobs")):
            got = asyncio.run(request(old, "POST", path, {**BASES[path], "max_tokens": 1, **example}))
            error = got.json()["error"]
            assert got.status == 400 and error["param"] == param, (backend, error)
            assert "engine rank 0 does not (protocol 1.2; 1.3 or newer does)" in error["message"], error
        # Without logprobs, echo asks nothing of the engines.
        got = asyncio.run(request(old, "POST", COMPLETIONS, {**BASES[COMPLETIONS], "max_tokens": 1, "echo": True}))
        assert got.status == 200, got.body
