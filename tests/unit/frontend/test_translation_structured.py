"""Translator with structured outputs, logits controls, prompt truncation and the template fields: what
reaches the engine (SamplingParams, prompt ids) and the 400s naming the field (structured.py,
openai_schema.sampling_params, translator.py)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import SamplingParams
from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.engine_request import EngineRequest, OutputOptions, refused_field
from services.frontend.requests.translator import Translator

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
COMPACT = json.dumps(SCHEMA, separators=(",", ":"))
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


@pytest.fixture(scope="module")
def translator(model: Model) -> Iterator[Translator]:
    t = Translator(model, lambda: 512, long_prompt_chars=2000, max_concurrent_tokenizations=1)
    yield t
    t.close()


def _chat(translator: Translator, **body: Any) -> EngineRequest:
    raw = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                      **body}).encode()
    return asyncio.run(translator.chat(raw, None))


def _completion(translator: Translator, **body: Any) -> EngineRequest:
    raw = json.dumps({"model": "tiny", "prompt": "hi", **body}).encode()
    [request] = asyncio.run(translator.completion(raw, None))
    return request


def _refused(call: Any, translator: Translator, **body: Any) -> APIError:
    with pytest.raises(APIError) as info:
        call(translator, **body)
    assert info.value.status == 400 and info.value.message.startswith(str(info.value.param)), info.value.message
    return info.value


def _constraint(s: SamplingParams) -> dict[str, Any]:
    kinds = ("json_schema", "regex", "choice", "grammar", "structural_tag")
    out = {k: getattr(s, k) for k in kinds if getattr(s, k) is not None}
    return {**out, "json_object": True} if s.json_object else out


@pytest.mark.parametrize(("body", "expected", "param"), [
    ({"response_format": {"type": "text"}}, {}, None),
    ({"response_format": {"type": "json_object"}}, {"json_object": True}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}},
     {"json_schema": COMPACT}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}},
     {"structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"x"}}'}, "response_format"),
    ({"response_format": {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
                          "triggers": ["<a>"]}},
     {"structural_tag": '{"type":"structural_tag","structures":[{"begin":"<a>","schema":{},"end":"</a>"}],'
                        '"triggers":["<a>"]}'}, "response_format"),
    ({"structured_outputs": {"json": SCHEMA}}, {"json_schema": COMPACT}, "structured_outputs.json"),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, {"json_schema": COMPACT}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": r"\d+", "disable_any_whitespace": True}}, {"regex": r"\d+"},
     "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"choice": ["yes", "no"]}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json_object": True, "disable_additional_properties": True}}, {"json_object": True},
     "structured_outputs.json_object"),
    ({"structured_outputs": {"structural_tag": '{"type": "structural_tag"}'}},
     {"structural_tag": '{"type": "structural_tag"}'}, "structured_outputs.structural_tag"),
    ({"guided_json": SCHEMA}, {"json_schema": COMPACT}, "guided_json"),
    ({"guided_regex": "a|b"}, {"regex": "a|b"}, "guided_regex"),
    ({"guided_choice": ["x"]}, {"choice": ["x"]}, "guided_choice"),
    ({"guided_grammar": 'root ::= "a"', "guided_decoding_backend": "xgrammar"}, {"grammar": 'root ::= "a"'},
     "guided_grammar"),
    ({"structural_tag": '{"type": "structural_tag"}'}, {"structural_tag": '{"type": "structural_tag"}'},
     "structural_tag"),
    ({"tools": [TOOL], "tool_choice": "required"}, None, "tool_choice"),
])
def test_each_structured_output_field_becomes_one_constraint(translator: Translator, body: dict[str, Any],
                                                             expected: dict[str, Any] | None,
                                                             param: str | None) -> None:
    for call in (_chat, _completion):
        if "tools" in body and call is _completion:
            continue
        req = call(translator, **body)
        got = _constraint(req.request.sampling)
        if expected is None:
            assert list(got) == ["json_schema"]
        else:
            assert got == expected
        assert req.output.constraint_param == param


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex",
     "only one kind of structured output per request, and response_format asks for one already"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs",
     "set exactly one of json, regex, choice, grammar, json_object and structural_tag; got 2 (regex, choice)"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs", "got none"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern",
     "takes no whitespace pattern"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object", "must be true if set"),
    ({"structured_outputs": {"json": "{oops"}}, "structured_outputs.json", "is not valid JSON"),
    ({"structured_outputs": {"json": [1]}}, "structured_outputs.json", "expected `str | object | null`"),
    ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json.type", "is not a valid JSON Schema"),
    ({"structured_outputs": {"json": '"x"'}}, "structured_outputs.json", "must be a JSON Schema object, got str"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one"),
    ({"structured_outputs": {"grammar": "  "}}, "structured_outputs.grammar", "must not be empty"),
    ({"structured_outputs": {"regex": "a\u0000"}}, "structured_outputs.regex", "NUL"),
    ({"structured_outputs": {"structural_tag": "[1]"}}, "structured_outputs.structural_tag", "JSON object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
     "response_format.json_schema.schema", "required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", "this field is required"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "this field is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"required": "a"}}}},
     "response_format.json_schema.schema.required", "not a valid JSON Schema"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "either `format`, or `structures`"),
    ({"response_format": {"type": "structural_tag", "structures": []}}, "response_format", "needs both"),
    ({"guided_json": "nope"}, "guided_json", "not valid JSON"),
    ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend", "'outlines': the engines' structured output"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}},
      "response_format": {"type": "json_object"}}, "response_format", "cannot be combined with tool_choice"),
])
def test_a_bad_or_second_constraint_is_a_400_naming_the_field(translator: Translator, body: dict[str, Any],
                                                              param: str, needle: str) -> None:
    err = _refused(_chat, translator, **body)
    assert err.param == param and needle in err.message, err.message


def test_logits_controls_reach_the_engine(translator: Translator, model: Model) -> None:
    s = _chat(translator, logit_bias={"9707": 100, "11": -5.5}, allowed_token_ids=[9707, 11],
              bad_words=["hello", " world"]).request.sampling
    assert (s.logit_bias, s.allowed_token_ids, s.bad_words) == ({9707: 100.0, 11: -5.5}, [9707, 11],
                                                                ["hello", " world"])
    plain = _completion(translator).request.sampling
    assert (plain.logit_bias, plain.allowed_token_ids, plain.bad_words) == (None, None, [])
    assert _completion(translator, logit_bias={}, bad_words=None).request.sampling.logit_bias is None


@pytest.mark.parametrize(("keep", "side", "expected"), [
    (None, None, slice(None)),
    (3, None, slice(-3, None)),  # vLLM's side for generation models: the last tokens
    (3, "left", slice(-3, None)),
    (3, "right", slice(0, 3)),
    (10, None, slice(None)),
])
def test_truncate_prompt_tokens_keeps_the_last_tokens_as_vllm(translator: Translator, model: Model,
                                                              keep: int | None, side: str | None,
                                                              expected: slice) -> None:
    prompt = list(range(100, 110))
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1}
    if keep is not None:
        body["truncate_prompt_tokens"] = keep
    if side is not None:
        body["truncation_side"] = side
    assert _completion(translator, **body).request.prompt_token_ids == prompt[expected]


def test_truncate_prompt_tokens_minus_one_keeps_what_the_context_holds(translator: Translator, model: Model) -> None:
    prompt = list(range(100, 700))  # 600 tokens, max_model_len 512
    req = _completion(translator, prompt=prompt, truncate_prompt_tokens=-1, max_tokens=1)
    assert req.request.prompt_token_ids == prompt[-511:]
    chat = _chat(translator, messages=[{"role": "user", "content": "word " * 600}], truncate_prompt_tokens=-1,
                 max_tokens=None)
    assert chat.prompt_len == 511 and chat.max_tokens == 1
    err = _refused(_completion, translator, prompt=prompt, truncate_prompt_tokens=0)
    assert err.param == "truncate_prompt_tokens" and "would leave no prompt" in err.message
    err = _refused(_completion, translator, prompt=prompt, truncate_prompt_tokens=513)
    assert err.param == "truncate_prompt_tokens" and "cannot be greater than max_model_len = 512" in err.message


def test_documents_and_reasoning_effort_reach_the_template(translator: Translator, model: Model) -> None:
    def prompt(**body: Any) -> str:
        return str(model.tokenizer.decode(_chat(translator, **body).request.prompt_token_ids,
                                          skip_special_tokens=False))

    assert prompt(reasoning_effort="none").endswith("<think>\n\n</think>\n\n")  # enable_thinking false
    assert prompt(reasoning_effort="high") == prompt()
    # The template's own kwargs win over the effort's enable_thinking, as in vLLM.
    assert prompt(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}) == prompt()
    assert prompt(documents=[{"title": "t", "text": "x"}]) == prompt()  # this template reads no documents


def test_chat_add_special_tokens_is_passed_to_the_tokenizer(translator: Translator) -> None:
    assert _chat(translator, add_special_tokens=True).prompt_len >= _chat(translator).prompt_len


def test_an_engines_refusal_is_told_as_the_request_field() -> None:
    options = OutputOptions(chat=True, stream=False, include_usage=False, continuous_usage=False, stop=(),
                            include_stop_str_in_output=False, skip_special_tokens=True,
                            constraint_param="structured_outputs.grammar")
    assert refused_field("sampling.grammar: vLLM's structured output (xgrammar) cannot use it: bad", options) == (
        "structured_outputs.grammar: vLLM's structured output (xgrammar) cannot use it: bad",
        "structured_outputs.grammar")
    assert refused_field("sampling.logit_bias: out of vocab", options) == ("logit_bias: out of vocab", "logit_bias")
    assert refused_field("prompt_token_ids is empty", options) == ("prompt_token_ids is empty", None)
    assert refused_field("sampling: something", options) == ("sampling: something", None)


def test_a_long_body_prepared_in_a_worker_keeps_its_constraint(translator: Translator) -> None:
    """Past long_prompt_chars the body is prepared in a worker process: the constraint comes back."""
    req = _chat(translator, messages=[{"role": "user", "content": "word " * 420}],
                structured_outputs={"choice": ["a", "b"]}, logit_bias={"5": 1})
    assert (req.request.sampling.choice, req.request.sampling.logit_bias) == (["a", "b"], {5: 1.0})
    assert req.output.constraint_param == "structured_outputs.choice"
    assert translator._workers._pool is not None  # it was a worker's
    err = _refused(_chat, translator, messages=[{"role": "user", "content": "word " * 420}],
                   structured_outputs={"choice": []})
    assert err.param == "structured_outputs.choice"


DEEP_TEXT = "[" * 1000 + "]" * 1000


@pytest.mark.parametrize(("body", "param"), [
    ({"guided_json": DEEP_TEXT}, "guided_json"),
    ({"structured_outputs": {"json": DEEP_TEXT}}, "structured_outputs.json"),
    ({"structural_tag": DEEP_TEXT}, "structural_tag"),
    ({"structured_outputs": {"structural_tag": DEEP_TEXT}}, "structured_outputs.structural_tag"),
])
def test_json_sent_as_text_nested_too_deeply_is_a_400_naming_the_field(translator: Translator, body: dict[str, Any],
                                                                       param: str) -> None:
    """The entry's depth check covers JSON inside a string too (it was a RecursionError, a 500)."""
    err = _refused(_completion, translator, **body)
    assert err.param == param and "nests too deeply" in err.message


BIG_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "a field"}
                                               for i in range(25_000)}}


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BIG_SCHEMA}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"json": json.dumps(BIG_SCHEMA)}}, "structured_outputs.json"),
    ({"guided_regex": "a" * 300_000}, "guided_regex"),
    ({"structured_outputs": {"grammar": "root ::= " + '"a" ' * 70_000}}, "structured_outputs.grammar"),
])
def test_a_constraint_past_the_size_limit_is_a_400_naming_the_field_and_the_limit(
        translator: Translator, body: dict[str, Any], param: str) -> None:
    err = _refused(_chat, translator, **body)
    assert err.param == param and "at most 262,144 are accepted" in err.message, err.message
