from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from prompting.chat_template import ChatTemplate
from services.frontend.errors import APIError
from services.frontend.requests.chat_messages import template_messages
from services.frontend.requests.json_body import parse
from services.frontend.requests.openai_schema import ChatCompletionRequest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# A tool round trip as the openai SDK sends it: arguments a JSON string, content null beside tool_calls.
ROUND_TRIP: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris","days":[1,2]}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21.5"},
    {"role": "assistant", "content": "It is sunny in Paris."},
    {"role": "user", "content": "Thanks"},
]


def _messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = json.dumps({"model": "m", "messages": messages}).encode()
    req: ChatCompletionRequest = parse(ChatCompletionRequest, body)
    return template_messages(req.messages)


def _refused(messages: list[dict[str, Any]]) -> APIError:
    with pytest.raises(APIError) as info:
        _messages(messages)
    assert info.value.status == 400
    return info.value


@pytest.fixture(scope="module")
def qwen_dir() -> Path:
    return checkpoints.resolve("tiny")


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_checkpoint(qwen_dir)


def test_round_trip_is_normalized_as_vllm_does() -> None:
    out = _messages(ROUND_TRIP)
    assert out[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]}
    assert out[3] == {"role": "tool", "content": "sunny, 21.5", "tool_call_id": "call_1"}
    assert out[0] == {"role": "system", "content": "You are helpful."}


EXPECTED_QWEN3 = (
    "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the "
    "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(WEATHER, ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    # the arguments string was decoded, so the template prints them with json.dumps' separators
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nsunny, 21.5\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nIt is sunny in Paris.<|im_end|>\n"
    "<|im_start|>user\nThanks<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_qwen3_renders_the_tool_round_trip_exactly(qwen: ChatTemplate) -> None:
    assert qwen.render(_messages(ROUND_TRIP), tools=[WEATHER]) == EXPECTED_QWEN3


def test_qwen3_round_trip_matches_transformers(qwen: ChatTemplate, qwen_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    messages = _messages(ROUND_TRIP)
    reference = tokenizer.apply_chat_template(copy.deepcopy(messages), tools=[copy.deepcopy(WEATHER)],
                                              tokenize=False, add_generation_prompt=True)
    assert qwen.render(messages, tools=[WEATHER]) == reference == EXPECTED_QWEN3


def test_string_arguments_would_print_raw_which_is_why_they_are_decoded(qwen: ChatTemplate) -> None:
    raw = copy.deepcopy(ROUND_TRIP)
    raw[2]["content"] = ""
    assert '"arguments": {"city":"Paris","days":[1,2]}}' in qwen.render(raw, tools=[WEATHER])


@pytest.mark.parametrize("role", ["user", "system"])
@pytest.mark.parametrize("content", ["absent", None])
def test_null_or_absent_content_renders_as_empty(role: str, content: object, qwen: ChatTemplate) -> None:
    message: dict[str, Any] = {"role": role} if content == "absent" else {"role": role, "content": content}
    messages = [message, {"role": "user", "content": "hi"}] if role == "system" else [message]
    out = _messages(messages)
    assert out[0] == {"role": role, "content": ""}
    text = qwen.render(out)
    assert text.startswith(f"<|im_start|>{role}\n<|im_end|>\n")


def test_content_parts_are_joined_with_newlines_in_every_role() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    out = _messages([{"role": "user", "content": parts}, {"role": "tool", "content": parts, "tool_call_id": "x"},
                     {"role": "developer", "content": parts}])
    assert [m["content"] for m in out] == ["a\nb"] * 3
    assert _messages([{"role": "user", "content": []}])[0]["content"] == ""


def test_name_developer_and_reasoning_pass_through_and_other_roles_fields_are_dropped() -> None:
    out = _messages([
        {"role": "developer", "content": "Be terse.", "name": "ops"},
        {"role": "user", "content": "hi", "name": "ann", "tool_call_id": "stray", "reasoning_content": "x"},
        {"role": "assistant", "content": "4", "reasoning_content": "2+2", "tool_calls": []},
        {"role": "tool", "content": "r"},  # as vLLM: tool_call_id is optional
    ])
    assert out == [
        {"role": "developer", "content": "Be terse.", "name": "ops"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "4", "reasoning_content": "2+2"},  # [] tool_calls dropped
        {"role": "tool", "content": "r"},
    ]


@pytest.mark.parametrize("arguments", [None, "", {"a": 1}])
def test_arguments_absent_empty_or_already_a_dict(arguments: object) -> None:
    function: dict[str, Any] = {"name": "f"}
    if arguments is not None:
        function["arguments"] = arguments
    out = _messages([{"role": "assistant", "tool_calls": [{"function": function}]}])
    assert out[0]["tool_calls"] == [{"function": {"name": "f", "arguments": arguments or {}}}]


def test_the_callers_tool_call_dicts_are_not_mutated() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}, "index": 0}
    req: ChatCompletionRequest = parse(ChatCompletionRequest, json.dumps(
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [call]}]}).encode())
    out = template_messages(req.messages)
    assert out[0]["tool_calls"][0] == {**call, "function": {"name": "f", "arguments": {"x": 1}}}
    assert req.messages[0].tool_calls == [call]


def _call(**function: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "ok", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c", "type": "function", "function": function}]}]


@pytest.mark.parametrize(("messages", "param", "needle"), [
    ([{"role": "bot", "content": "x"}], "messages[0].role",
     "'bot' is not one of: system, developer, user, assistant, tool"),
    ([{"role": "function", "content": "x"}], "messages[0].role", "is not one of"),
    (_call(name="f", arguments="{not json"), "messages[1].tool_calls[1].function.arguments",
     "must be a JSON object encoded as a string; it is not valid JSON"),
    (_call(name="f", arguments="[1, 2]"), "messages[1].tool_calls[1].function.arguments",
     "must be a JSON object encoded as a string, got a JSON array"),
    (_call(name="f", arguments='"s"'), "messages[1].tool_calls[1].function.arguments", "got a JSON string"),
    (_call(name="f", arguments=7), "messages[1].tool_calls[1].function.arguments", "got int"),
    (_call(arguments="{}"), "messages[1].tool_calls[1].function.name", "required: a non-empty string"),
    (_call(name="", arguments="{}"), "messages[1].tool_calls[1].function.name", "non-empty string"),
    (_call(name=3, arguments="{}"), "messages[1].tool_calls[1].function.name", "non-empty string"),
    ([{"role": "assistant", "tool_calls": [{"id": "c"}]}], "messages[0].tool_calls[0].function",
     'required: an object {"name": string, "arguments": JSON object string}'),
    ([{"role": "assistant", "tool_calls": [{"type": "custom", "function": {"name": "f"}}]}],
     "messages[0].tool_calls[0].type", "the only tool call type is \"function\""),
    ([{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]}],
     "messages[0].tool_calls[0].id", "must be a string"),
    ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
     "messages[0].tool_calls", "only assistant messages carry tool calls, not 'user' ones"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]", "only text content parts are supported"),
])
def test_bad_shapes_are_400s_naming_the_field(messages: list[dict[str, Any]], param: str, needle: str) -> None:
    err = _refused(messages)
    assert err.param == param and err.message.startswith(param + ": ") and needle in err.message, err.message


def test_type_errors_are_named_by_the_decoder() -> None:
    err = _refused([{"role": "assistant", "tool_calls": ["not an object"]}])
    assert err.param == "messages[0].tool_calls[0]" and "expected `object`" in err.message
