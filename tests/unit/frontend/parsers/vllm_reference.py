"""vLLM's own reasoning and tool-call parsers run on a model output, as vLLM's non-streamed chat
completion runs them, and ours run on the same output, whole and in pieces: the two sides of the
differential test (test_vllm_differential.py). Also how each family writes a call."""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import checkpoints
from services.frontend.parsers import build_parser
from tests.unit.frontend.parsers.harness import drive, token_pieces

# The tools every row offers: the XML-style formats type their values by these schemas.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]

# Markers the tiny checkpoint's tokenizer (Qwen3's) lacks and vLLM's parsers look up in the vocabulary.
# Marker tokens the tiny (Qwen3) tokenizer lacks, added as special tokens so that vLLM's parsers find them.
EXTRA_TOKENS = ["<|python_tag|>", "<|tool_call|>", "[TOOL_CALLS]", "[ARGS]", "<｜tool▁calls▁begin｜>",
                 "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"]


@dataclass(frozen=True, slots=True)
class Result:
    """What a client ends with: the message (arguments parsed) and the finish reason."""

    content: str
    reasoning: str
    calls: tuple[tuple[str, Any], ...]  # (name, parsed arguments)
    finish: str


def _arguments(text: str) -> Any:
    """Arguments as a strict client reads them: NaN and Infinity (which Python's json module writes and
    reads) are not JSON, so arguments holding one are no object."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return ("not JSON", text)  # never equal to a parsed object: a difference shows


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@functools.cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import get_cached_tokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoints.resolve("tiny")))
    tok.add_special_tokens({"additional_special_tokens": EXTRA_TOKENS})
    return get_cached_tokenizer(tok)  # as vLLM serves it: the vocabulary read once, not per parser


@functools.cache
def _request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                 tool_choice="auto")


@functools.cache
def _parser_class(tool: str | None, reasoning: str | None) -> Any:
    from vllm.parser.parser_manager import ParserManager

    parser_cls = ParserManager.get_parser(tool_parser_name=tool, reasoning_parser_name=reasoning,
                                          enable_auto_tools=tool is not None, tokenizer=_tokenizer())
    assert parser_cls is not None
    return parser_cls


def vllm_result(tool: str | None, reasoning: str | None, text: str, engine_finish: str) -> Result:
    """vLLM's non-streamed chat completion of `text`: its composed parser's `parse`, and the finish
    reason its serving layer gives ("tool_calls" whenever calls were extracted with tool_choice auto)."""
    tok = _tokenizer()
    got_reasoning, content, calls = _parser_class(tool, reasoning)(tok).parse(
        text, _request(), enable_auto_tools=tool is not None)
    parsed = tuple((c.name, _arguments(c.arguments)) for c in calls or [])
    return Result(content or "", got_reasoning or "", parsed, "tool_calls" if parsed else engine_finish)


def our_results(tool: str | None, reasoning: str | None, text: str, engine_finish: str,
                splits: Sequence[str] = ("whole", "tokens", "chars")) -> dict[str, Result]:
    """Ours, by how the text was handed to the parser: whole (a non-streamed request's text arrives
    in one piece at most... and in any case the same parser runs), per Qwen3 token, per character.
    The finish reason as generation/output.py gives it: "tool_calls" when calls were made and the
    model stopped on its own."""
    ways: dict[str, Callable[[str], list[str]]] = {"whole": lambda t: [t], "tokens": token_pieces, "chars": list}
    results = {}
    for way in splits:
        parser = build_parser(tool, reasoning, tools=TOOLS)
        assert parser is not None and not hasattr(parser, "push_tokens")
        final, _ = drive(parser, ways[way](text), id_ok=lambda _: True)  # type: ignore[arg-type]
        parsed = tuple((name, _arguments(arguments)) for name, arguments in final.calls)
        finish = "tool_calls" if parsed and engine_finish == "stop" else engine_finish
        results[way] = Result(final.content, final.reasoning, parsed, finish)
    return results


# How each family writes calls: call(name, arguments, index) and the text around a list of them.

def py_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(py_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _xml_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _j(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Format:
    call: Callable[[str, dict[str, Any], int], str]
    calls: Callable[[list[str]], str]


DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI_SECTION, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"

FORMATS: dict[str, Format] = {
    "hermes": Format(lambda n, a, i: f'<tool_call>\n{{"name": "{n}", "arguments": {_j(a)}}}\n</tool_call>',
                     "\n".join),
    "llama3_json": Format(lambda n, a, i: f'{{"name": "{n}", "parameters": {_j(a)}}}', "; ".join),
    "pythonic": Format(lambda n, a, i: f"{n}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in a.items()) + ")",
                       lambda cs: "[" + ", ".join(cs) + "]"),
    "mistral": Format(lambda n, a, i: f"[TOOL_CALLS]{n}[ARGS]{_j(a)}", "".join),
    "qwen3_coder": Format(lambda n, a, i: f"<tool_call>\n<function={n}>\n" + "".join(
        f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items()) + "</function>\n</tool_call>",
        "\n".join),
    "glm45": Format(lambda n, a, i: f"<tool_call>{n}\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{_xml_value(v)}</arg_value>\n" for k, v in a.items()) + "</tool_call>",
        "\n".join),
    "kimi_k2": Format(lambda n, a, i: f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_j(a)}"
                                      "<|tool_call_end|>", lambda cs: KIMI_SECTION + "".join(cs) + KIMI_SECTION_END),
    "deepseek_v3": Format(lambda n, a, i: f"{DS_CALL}function{DS_SEP}{n}\n```json\n{_j(a)}\n```{DS_CALL_END}",
                          lambda cs: DS_CALLS + "\n".join(cs) + DS_CALLS_END),
    "deepseek_v31": Format(lambda n, a, i: f"{DS_CALL}{n}{DS_SEP}{_j(a)}{DS_CALL_END}",
                           lambda cs: DS_CALLS + "".join(cs) + DS_CALLS_END),
}
FORMATS["llama4_json"] = FORMATS["llama3_json"]
FORMATS["qwen3_xml"] = FORMATS["qwen3_coder"]
FORMATS["granite"] = Format(lambda n, a, i: f'{{"name": "{n}", "arguments": {_j(a)}}}',
                            lambda cs: "<|tool_call|>[" + ", ".join(cs) + "]")
FORMATS["phi4_mini_json"] = Format(FORMATS["granite"].call, lambda cs: "functools[" + ", ".join(cs) + "]")
FORMATS["minimax_m2"] = Format(lambda n, a, i: f'<invoke name="{n}">\n' + "".join(
    f'<parameter name="{k}">{_xml_value(v)}</parameter>\n' for k, v in a.items()) + "</invoke>",
    lambda cs: "<minimax:tool_call>\n" + "\n".join(cs) + "\n</minimax:tool_call>")
FORMATS["seed_oss"] = Format(
    lambda n, a, i: FORMATS["qwen3_coder"].call(n, a, i).replace("tool_call>", "seed:tool_call>"), "\n".join)


def render(family: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    fmt = FORMATS[family]
    return fmt.calls([fmt.call(name, arguments, i) for i, (name, arguments) in enumerate(calls)])
