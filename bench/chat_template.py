"""Render cost of the tiny model's Qwen3 chat template: a 10-message conversation with 2 tools.

Side by side in one run: ours (minijinja, prompting/chat_template.py) and the reference
transformers renders with jinja2, both its bare renderer and tokenizer.apply_chat_template(tokenize=False).
Usage: python bench/chat_template.py [--repeat 7] [--n 500]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from timing import per_call_us

import checkpoints
from prompting.chat_template import ChatTemplate, _copy


def _tool(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "required": ["location"], "properties": {
            "location": {"type": "object",
                         "properties": {"city": {"type": "string"}, "country": {"type": "string"}}},
            "temperature": {"type": "number", "default": 18.0},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}


TOOLS: list[Any] = [_tool("get_weather", "查询城市天气: current weather"), _tool("get_forecast", "5 days")]
CALL: dict[str, Any] = {"type": "function",
                        "function": {"name": "get_weather", "arguments": {"location": {"city": "Paris"}}}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant. " * 8},
    {"role": "user", "content": "What's the weather in Paris and Beijing? " * 4},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"sky": "sunny", "temperature": 21.5}'},
    {"role": "assistant", "content": "It is sunny in Paris, 21.5 degrees."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the forecast tool.", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"sky": "rain", "temperature": 18.0}'},
    {"role": "assistant", "content": "<think>\nsummarise\n</think>\n\nRain tomorrow, 18 degrees."},
    {"role": "user", "content": "Thanks! Anything else I should know? " * 3},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()

    path = checkpoints.resolve("tiny")
    template = ChatTemplate.from_checkpoint(path)
    ours = template.render(MESSAGES, tools=TOOLS)

    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    source: Any = tokenizer.get_chat_template()
    tokens: dict[str, Any] = tokenizer.special_tokens_map

    def bare() -> object:
        # Returns (rendered conversations, generation indices), whatever its annotation says.
        result: Any = render_jinja_template([MESSAGES], tools=TOOLS, chat_template=source,
                                            add_generation_prompt=True, **tokens)
        return result[0][0]

    def apply() -> object:
        return tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False,
                                             add_generation_prompt=True)

    if not ours == bare() == apply():
        raise SystemExit("renders differ: run tests/unit/prompting/test_chat_template.py")
    rows = [
        ("ours: ChatTemplate.render (minijinja)", per_call_us(lambda: template.render(MESSAGES, tools=TOOLS),
                                                             args.n, args.repeat)),
        ("  of which the request copy", per_call_us(lambda: (_copy(MESSAGES, "m"), _copy(TOOLS, "t")),
                                                   args.n, args.repeat)),
        ("transformers render_jinja_template (jinja2)", per_call_us(bare, args.n, args.repeat)),
        ("transformers apply_chat_template(tokenize=False)", per_call_us(apply, args.n, args.repeat)),
    ]
    print(f"Qwen3 template, {len(MESSAGES)} messages, {len(TOOLS)} tools, prompt {len(ours)} chars")
    for name, us in rows:
        print(f"{name:<52}{us:>10.1f} us")
    print(f"(median of {args.repeat} runs of {args.n} renders each)")


if __name__ == "__main__":
    main()
