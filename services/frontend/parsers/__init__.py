"""Incremental reasoning and tool-call parsers for a request's streamed text, by the names of
vLLM's --reasoning-parser and --tool-call-parser flags. Runs in frontend API-server processes."""
from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from services.frontend.parsers import glm45 as glm45_tags
from services.frontend.parsers import kimi_k2 as kimi_tags
from services.frontend.parsers.call_blocks import CallBlockParser
from services.frontend.parsers.chain import Chain
from services.frontend.parsers.deepseek_r1 import deepseek_r1
from services.frontend.parsers.deepseek_v3 import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from services.frontend.parsers.delta import OutputParser, ParsedDelta, TokenOutputParser, ToolCall, ToolCallDelta
from services.frontend.parsers.glm45 import Glm45ToolParser, glm45
from services.frontend.parsers.granite import MARKERS as GRANITE_MARKERS
from services.frontend.parsers.granite import GraniteToolParser, Phi4MiniJsonToolParser
from services.frontend.parsers.harmony import HarmonyParser
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.kimi_k2 import KimiK2ToolParser, kimi_k2
from services.frontend.parsers.llama3_json import PYTHON_TAG, Llama3JsonToolParser
from services.frontend.parsers.minimax_m2 import MinimaxM2ToolParser, minimax_m2
from services.frontend.parsers.mistral import BOT, MistralToolParser
from services.frontend.parsers.pythonic import PythonicToolParser
from services.frontend.parsers.qwen3 import SEED_THINK, qwen3, seed_oss
from services.frontend.parsers.qwen3_coder import Qwen3CoderToolParser, SeedOssToolParser

__all__ = ["HARMONY_REASONING_PARSERS", "HARMONY_TOOL_PARSERS", "REASONING_MARKERS", "REASONING_PARSERS",
           "REASONING_PARSER_NAMES", "TOOL_MARKERS", "TOOL_PARSERS", "TOOL_PARSER_NAMES", "OutputParser", "ParsedDelta",
           "TokenOutputParser", "ToolCall", "ToolCallDelta", "build_parser", "keeps_special_tokens"]

# name -> factory(tools): the request's tools (OpenAI shape) give parameter types where a format needs them.
TOOL_PARSERS: dict[str, Callable[[list[dict[str, Any]] | None], OutputParser]] = {
    "deepseek_v3": lambda tools: DeepSeekV3ToolParser(),
    "deepseek_v31": lambda tools: DeepSeekV31ToolParser(),
    "glm45": Glm45ToolParser,
    "granite": lambda tools: GraniteToolParser(),
    "hermes": lambda tools: HermesToolParser(),
    "kimi_k2": lambda tools: KimiK2ToolParser(),
    "llama3_json": lambda tools: Llama3JsonToolParser(),
    "llama4_json": lambda tools: Llama3JsonToolParser(),
    "minimax_m2": MinimaxM2ToolParser,
    "mistral": lambda tools: MistralToolParser(),
    "phi4_mini_json": lambda tools: Phi4MiniJsonToolParser(),
    "pythonic": lambda tools: PythonicToolParser(),
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,  # vLLM's other name for the same parser
    "seed_oss": SeedOssToolParser,
}
# The tags each family's output is read by. Where the served model's tokenizer marks one of them
# special (Mistral's [TOOL_CALLS], Kimi's section tags, GLM-4.5's <tool_call>), skipping special
# tokens would hide it from the parser: such a request keeps them (`keeps_special_tokens`), as
# vLLM's parsers ask of a request.
_THINK = ("<think>", "</think>")
TOOL_MARKERS: dict[str, tuple[str, ...]] = {
    "deepseek_v3": (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP),
    "deepseek_v31": (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP),
    "glm45": (CallBlockParser.START, CallBlockParser.END, glm45_tags.KEY, glm45_tags.KEY_END, glm45_tags.VALUE,
              glm45_tags.VALUE_END),
    "granite": GRANITE_MARKERS,
    "hermes": (CallBlockParser.START, CallBlockParser.END),
    "kimi_k2": (*kimi_tags.SECTION_BEGIN, *kimi_tags.SECTION_END, kimi_tags.CALL_BEGIN, kimi_tags.CALL_END,
                kimi_tags.ARGUMENT_BEGIN),
    "llama3_json": (PYTHON_TAG,),
    "llama4_json": (PYTHON_TAG,),
    "minimax_m2": (MinimaxM2ToolParser.START, MinimaxM2ToolParser.END),
    "mistral": (BOT, "[ARGS]"),
    "phi4_mini_json": Phi4MiniJsonToolParser.MARKERS,
    "pythonic": (),
    "qwen3_coder": (CallBlockParser.START, CallBlockParser.END),
    "qwen3_xml": (CallBlockParser.START, CallBlockParser.END),
    "seed_oss": (SeedOssToolParser.START, SeedOssToolParser.END),
}
REASONING_MARKERS: dict[str, tuple[str, ...]] = {
    "deepseek_r1": _THINK, "glm45": _THINK, "kimi_k2": (*_THINK, *kimi_tags.SECTION_BEGIN), "qwen3": _THINK,
    "seed_oss": SEED_THINK, "minimax_m2": (*_THINK, MinimaxM2ToolParser.START)}
# name -> factory(prompt): the rendered prompt tells whether the template opened the reasoning.
REASONING_PARSERS: dict[str, Callable[[str], OutputParser]] = {
    "deepseek_r1": deepseek_r1,
    "glm45": glm45,
    "kimi_k2": kimi_k2,
    "minimax_m2": minimax_m2,
    "qwen3": qwen3,
    "seed_oss": seed_oss,
}


# gpt-oss's harmony format, one parser for both (its markers are special tokens: read by token id).
HARMONY_TOOL_PARSERS = frozenset({"openai"})
HARMONY_REASONING_PARSERS = frozenset({"openai", "openai_gptoss"})  # vLLM's name, and the short one
TOOL_PARSER_NAMES = tuple(sorted({*TOOL_PARSERS, *HARMONY_TOOL_PARSERS}))
REASONING_PARSER_NAMES = tuple(sorted({*REASONING_PARSERS, *HARMONY_REASONING_PARSERS}))


def build_parser(tool_parser: str | None, reasoning_parser: str | None, *,
                 tools: list[dict[str, Any]] | None = None,
                 prompt: str = "") -> OutputParser | TokenOutputParser | None:
    """One request's parser: reasoning first, then tool calls in its content; None for neither.
    Harmony's names give the one harmony parser, reading calls when `tool_parser` names it."""
    if tool_parser in HARMONY_TOOL_PARSERS or reasoning_parser in HARMONY_REASONING_PARSERS:
        return HarmonyParser(calls=tool_parser in HARMONY_TOOL_PARSERS)
    tool = _factory(TOOL_PARSERS, "tool_call_parser", tool_parser)
    reasoning = _factory(REASONING_PARSERS, "reasoning_parser", reasoning_parser)
    tool_part = tool(tools) if tool is not None else None
    reasoning_part = reasoning(prompt) if reasoning is not None else None
    if tool_part is not None and reasoning_part is not None:
        return Chain(reasoning_part, tool_part)
    return tool_part if tool_part is not None else reasoning_part


def _factory(registry: dict[str, Any], field: str, name: str | None) -> Any:
    if name is None:
        return None
    if name not in registry:
        raise ValueError(f"{field}: unknown parser {name!r}; expected one of {', '.join(sorted(registry))}")
    return registry[name]


def keeps_special_tokens(markers: dict[str, tuple[str, ...]], name: str | None, special: AbstractSet[str]) -> bool:
    """Whether the family `name` reads a tag that is one of the tokenizer's `special` tokens."""
    return name is not None and any(tag in special for tag in markers.get(name, ()))
