"""Tool-calling requests through the real frontend process over a headless sim engine, driven by the
openai SDK as a client sends them (arguments as JSON strings, assistant content null beside tool_calls)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from protocol import MAJOR, MINOR
from tests.support.procs import openai_over_sim

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ROUND_TRIP: Any = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21.5"},
    {"role": "assistant", "content": "It is sunny in Paris."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp: Path = tmp_path_factory.mktemp("tools")
    with openai_over_sim(tmp, ["--sim-decode-ms", "1"], ["--engine-timeout", "1.0"]) as c:
        yield c


def _bad_request(client: openai.OpenAI, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", max_tokens=4, **kwargs)
    body = info.value.body
    assert isinstance(body, dict)
    return body


def test_tool_call_history_round_trip_is_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=ROUND_TRIP, max_tokens=4)
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.prompt_tokens > 20


def test_tools_with_tool_choice_none_are_rendered_and_accepted(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="tiny", messages=ROUND_TRIP, max_tokens=4)
    r = client.chat.completions.create(model="tiny", messages=ROUND_TRIP, max_tokens=4, tools=[WEATHER],
                                       tool_choice="none", parallel_tool_calls=False)
    assert r.usage is not None and plain.usage is not None
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools' block is in the prompt


def test_tools_without_tool_choice_mean_auto_which_this_server_refuses(client: openai.OpenAI) -> None:
    body = _bad_request(client, messages=ROUND_TRIP, tools=[WEATHER])
    assert body["param"] == "tool_choice"
    assert body["message"] == ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                               "to be set")


def test_a_bad_tool_name_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    bad = {"type": "function", "function": {"name": "get weather!"}}
    body = _bad_request(client, messages=ROUND_TRIP, tools=[WEATHER, bad], tool_choice="none")
    assert body["param"] == "tools[1].function.name" and "1 to 64 characters" in body["message"]


def test_bad_arguments_in_the_history_are_a_400_naming_the_field(client: openai.OpenAI) -> None:
    messages = [*ROUND_TRIP[:2], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{'city': 'Paris'}"}}]}]
    body = _bad_request(client, messages=messages)
    assert body["param"] == "messages[2].tool_calls[0].function.arguments"
    assert "not valid JSON" in body["message"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_choice_is_refused_on_engines_that_cannot_guarantee_it(client: openai.OpenAI,
                                                                              choice: Any) -> None:
    body = _bad_request(client, messages=ROUND_TRIP[:1], tools=[WEATHER], tool_choice=choice)
    assert body["param"] == "tool_choice"
    assert "needs guaranteed structured output, which engine rank 0 cannot (its sim backend" in body["message"]


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER["function"][
        "parameters"]}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"extra_body": {"structured_outputs": {"regex": "[a-z]+"}}}, "structured_outputs.regex"),
    ({"extra_body": {"guided_choice": ["yes", "no"]}}, "guided_choice"),
    ({"logit_bias": {"9707": 10}}, "logit_bias"),
    ({"extra_body": {"allowed_token_ids": [9707]}}, "allowed_token_ids"),
    ({"extra_body": {"bad_words": ["sunny"]}}, "bad_words"),
])
def test_structured_outputs_and_logits_controls_are_refused_on_sim_engines(client: openai.OpenAI,
                                                                           kwargs: Any, param: str) -> None:
    """Refused by name, never ignored: a client that asked for JSON must not get the sim's free text."""
    body = _bad_request(client, messages=ROUND_TRIP[:2], **kwargs)
    assert body["param"] == param
    # The sim engine speaks this checkout's protocol version.
    assert (f"which engine rank 0 cannot (its sim backend, protocol {MAJOR}.{MINOR}; the vllm backend with "
            "protocol 1.3 or newer can)") in body["message"], body


def test_a_field_neither_openai_nor_vllm_has_is_a_400_naming_it(client: openai.OpenAI) -> None:
    body = _bad_request(client, messages=ROUND_TRIP[:2], extra_body={"respone_format": {"type": "json_object"}})
    assert body["param"] == "respone_format" and "unknown field" in body["message"]
