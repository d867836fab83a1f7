"""Incremental reasoning and tool-call parsers for a request's streamed text, by the names of
vLLM's --reasoning-parser and --tool-call-parser flags. Runs in frontend API-server processes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.frontend.parsers.chain import Chain
from services.frontend.parsers.deepseek_r1 import deepseek_r1
from services.frontend.parsers.deepseek_v3 import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from services.frontend.parsers.delta import OutputParser, ParsedDelta, ToolCall, ToolCallDelta
from services.frontend.parsers.glm45 import Glm45ToolParser, glm45
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.kimi_k2 import KimiK2ToolParser, kimi_k2
from services.frontend.parsers.llama3_json import Llama3JsonToolParser
from services.frontend.parsers.mistral import MistralToolParser
from services.frontend.parsers.pythonic import PythonicToolParser
from services.frontend.parsers.qwen3 import qwen3
from services.frontend.parsers.qwen3_coder import Qwen3CoderToolParser

__all__ = ["KEEPS_SPECIAL_TOKENS", "REASONING_PARSERS", "TOOL_PARSERS", "OutputParser", "ParsedDelta", "ToolCall",
           "ToolCallDelta", "build_parser"]

# name -> factory(tools): the request's tools (OpenAI shape) give parameter types where a format needs them.
TOOL_PARSERS: dict[str, Callable[[list[dict[str, Any]] | None], OutputParser]] = {
    "deepseek_v3": lambda tools: DeepSeekV3ToolParser(),
    "deepseek_v31": lambda tools: DeepSeekV31ToolParser(),
    "glm45": Glm45ToolParser,
    "hermes": lambda tools: HermesToolParser(),
    "kimi_k2": lambda tools: KimiK2ToolParser(),
    "llama3_json": lambda tools: Llama3JsonToolParser(),
    "llama4_json": lambda tools: Llama3JsonToolParser(),
    "mistral": lambda tools: MistralToolParser(),
    "pythonic": lambda tools: PythonicToolParser(),
    "qwen3_coder": Qwen3CoderToolParser,
}
# Families whose call marker is a special token of their tokenizers (Mistral's [TOOL_CALLS]): the
# detokenizer must keep special tokens for the parser to see it, as vLLM's parser asks of a request.
KEEPS_SPECIAL_TOKENS = frozenset({"mistral"})
# name -> factory(prompt): the rendered prompt tells whether the template opened the reasoning.
REASONING_PARSERS: dict[str, Callable[[str], OutputParser]] = {
    "deepseek_r1": deepseek_r1,
    "glm45": glm45,
    "kimi_k2": kimi_k2,
    "qwen3": qwen3,
}


def build_parser(tool_parser: str | None, reasoning_parser: str | None, *,
                 tools: list[dict[str, Any]] | None = None, prompt: str = "") -> OutputParser | None:
    """One request's parser: reasoning first, then tool calls in its content; None for neither."""
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
