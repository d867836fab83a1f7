"""Tool calls and reasoning end to end: a frontend with `--tool-call-parser hermes --reasoning-parser qwen3`
over a sim engine whose replies are scripted (`--sim-script`) in Qwen3's real output format, driven by
the official openai SDK, streamed and not, with the history rendered back through the real template."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support.procs import EngineProc, FrontendProc, HttpProc, start_engine, start_frontend, start_router

THINK = "The user asks for the weather; I should call the tool."
ONE_CALL = ('<think>\n' + THINK + '\n</think>\n\nLet me check.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}\n</tool_call>')
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō", "note": "a } and \\" inside"}}\n'
             '</tool_call>')
ANSWER = "<think>\nThe tool said sunny.\n</think>\n\nIt is sunny in Paris."
PLAIN = "No tools needed here."
# First match wins: the tool result turn (its <tool_response> is in the rendered prompt) comes first.
SCRIPT = [
    {"match": "<tool_response>", "reply": ANSWER},
    {"match": "two cities", "reply": TWO_CALLS},
    {"match": "weather in Paris", "reply": ONE_CALL},
    {"match": "say plain", "reply": PLAIN},
]
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProc, FrontendProc, HttpProc]]:
    tmp = tmp_path_factory.mktemp("tools")
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    engine = start_engine(tmp, "--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1",
                          "--sim-script", str(script))
    try:
        fe = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                            "--reasoning-parser", "qwen3")
        try:
            router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  tiny: {{model: tiny, replicas: [{{url: {fe.url}}}]}}
entries:
  tiny: {{default: [tiny]}}
""")
            yield engine, fe, router
            router.stop()
        finally:
            fe.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def client(fleet: tuple[EngineProc, FrontendProc, HttpProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[1].url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def _streamed(client: openai.OpenAI, **kwargs: Any) -> dict[str, Any]:
    """A stream's deltas reassembled: content, reasoning, calls by index, finish_reason."""
    content, reasoning, finish = [], [], None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(model="tiny", stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for call in delta.tool_calls or []:
                if call.index not in calls:
                    assert call.id and call.type == "function" and call.function and call.function.name, call
                    calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:
                    assert call.id is None and (call.function is None or call.function.name is None), call
                calls[call.index]["arguments"] += (call.function.arguments if call.function else None) or ""
            finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls)))
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def _whole(client: openai.OpenAI, **kwargs: Any) -> dict[str, Any]:
    r = client.chat.completions.create(model="tiny", **kwargs)
    message = r.choices[0].message
    return {"content": message.content or "", "reasoning": (message.model_extra or {}).get("reasoning_content") or "",
            "calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                      for c in message.tool_calls or []], "finish": r.choices[0].finish_reason}


def _same_but_ids(a: dict[str, Any], b: dict[str, Any]) -> None:
    strip = [{k: v for k, v in call.items() if k != "id"} for call in a["calls"]]
    assert {**a, "calls": strip} == {**b, "calls": [{k: v for k, v in c.items() if k != "id"} for c in b["calls"]]}


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reasoning_then_a_call(client: openai.OpenAI, stream: bool) -> None:
    got = (_streamed if stream else _whole)(client, messages=_ask("weather in Paris?"), tools=TOOLS)
    assert got["finish"] == "tool_calls"
    assert THINK in got["reasoning"] and "<think>" not in got["reasoning"] + got["content"]
    assert got["content"].strip() == "Let me check." and "<tool_call>" not in got["content"]
    [call] = got["calls"]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Paris", "unit": "°C"}


def test_streamed_and_whole_answers_agree(client: openai.OpenAI) -> None:
    for text in ("weather in Paris?", "two cities please", "say plain"):
        kwargs = {"messages": _ask(text), "tools": TOOLS}
        _same_but_ids(_streamed(client, **kwargs), _whole(client, **kwargs))


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_calls_and_parallel_tool_calls_false(client: openai.OpenAI, stream: bool) -> None:
    ask = _streamed if stream else _whole
    both = ask(client, messages=_ask("two cities please"), tools=TOOLS)
    assert [json.loads(c["arguments"]) for c in both["calls"]] == [
        {"city": "Paris"}, {"city": "Tōkyō", "note": 'a } and " inside'}]
    assert len({c["id"] for c in both["calls"]}) == 2 and both["content"].strip() == ""
    one = ask(client, messages=_ask("two cities please"), tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(c["arguments"]) for c in one["calls"]] == [{"city": "Paris"}]


def test_tool_choice_none_leaves_the_text_as_it_is(client: openai.OpenAI) -> None:
    got = _whole(client, messages=_ask("two cities please"), tools=TOOLS, tool_choice="none")
    assert got["calls"] == [] and got["finish"] == "stop"
    assert got["content"].count("<tool_call>") == 2


def test_a_full_round_trip_through_the_template(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="tiny", messages=_ask("weather in Paris?"), tools=TOOLS)
    message = first.choices[0].message
    [call] = message.tool_calls or []
    history: list[Any] = [
        *_ask("weather in Paris?"),
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "temp": 21})},
    ]
    final = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    answer = final.choices[0].message
    assert final.choices[0].finish_reason == "stop" and answer.tool_calls == []
    assert answer.content is not None and answer.content.strip() == "It is sunny in Paris."
    assert (answer.model_extra or {})["reasoning_content"].strip() == "The tool said sunny."


def test_no_reasoning_and_no_calls_is_plain_content(client: openai.OpenAI) -> None:
    got = _whole(client, messages=_ask("say plain"), tools=TOOLS)
    assert got == {"content": PLAIN, "reasoning": "", "calls": [], "finish": "stop"}
    off = _whole(client, messages=_ask("say plain"), extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off == {"content": PLAIN, "reasoning": "", "calls": [], "finish": "stop"}



# ---- through the router: the Anthropic Messages and OpenAI Responses APIs over the same frontend ----

ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "description": "Current weather of a city",
                               "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def claude(fleet: tuple[EngineProc, FrontendProc, HttpProc]) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fleet[2].url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def router_openai(fleet: tuple[EngineProc, FrontendProc, HttpProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[2].url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_and_a_tool_result_round_trip(claude: anthropic.Anthropic, stream: bool) -> None:
    ask: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    kwargs: dict[str, Any] = {"model": "tiny", "max_tokens": 200, "tools": ANTHROPIC_TOOLS}
    if stream:
        with claude.messages.stream(messages=ask, **kwargs) as events:
            message = events.get_final_message()
    else:
        message = claude.messages.create(messages=ask, **kwargs)
    assert message.stop_reason == "tool_use"
    [text, use] = message.content
    assert text.type == "text" and text.text.strip() == "Let me check."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris", "unit": "°C"}
    history = [*ask, {"role": "assistant", "content": [block.model_dump() for block in message.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": json.dumps({"sky": "sunny"})}]}]
    final = claude.messages.create(messages=history, **kwargs)
    assert final.stop_reason == "end_turn"
    assert [b.text for b in final.content if b.type == "text"] == ["It is sunny in Paris."]


def test_messages_thinking_blocks_when_thinking_is_enabled(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="tiny", max_tokens=2000, tools=ANTHROPIC_TOOLS,
                                     thinking={"type": "enabled", "budget_tokens": 1024},
                                     messages=[{"role": "user", "content": "weather in Paris?"}])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking.strip() == THINK  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_calls_and_their_output(router_openai: openai.OpenAI, stream: bool) -> None:
    tools: list[Any] = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
                         "parameters": TOOLS[0]["function"]["parameters"]}]
    if stream:
        with router_openai.responses.stream(model="tiny", input="two cities please", tools=tools) as events:
            response = events.get_final_response()
    else:
        response = router_openai.responses.create(model="tiny", input="two cities please", tools=tools)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"},  # type: ignore[union-attr]
                                                        {"city": "Tōkyō", "note": 'a } and " inside'}]
    follow = [{"type": "message", "role": "user", "content": "two cities please"},
              *[c.model_dump(exclude_none=True) for c in calls],
              *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}  # type: ignore[union-attr]
                for c in calls]]
    final = router_openai.responses.create(model="tiny", input=follow, tools=tools)
    assert final.output_text.strip() == "It is sunny in Paris."
