"""Drives an output parser over one model output split in many ways and checks what a client sees:
the streamed pieces join to the final content, reasoning and calls, however the text was split."""
from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

import checkpoints
from services.frontend.parsers import OutputParser, ParsedDelta, TokenOutputParser
from services.frontend.text.detokenizer import IncrementalDetokenizer

TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<function=", "</function>", "<parameter=",
        "</parameter>", "[TOOL_CALLS]", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_section_begin|>",
        "<|tool_call_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>")


@dataclass(frozen=True, slots=True)
class Final:
    content: str
    reasoning: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments)


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))


def token_pieces(text: str) -> list[str]:
    """The text as the frontend's detokenizer hands it over, one Qwen3 token at a time."""
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, tok.encode("<|im_start|>assistant\n").ids, skip_special_tokens=False)
    pieces = [detok.push([tid]) for tid in tok.encode(text, add_special_tokens=False).ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text, "the tokenizer does not round-trip this text"
    return pieces


def random_pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def splittings(text: str, *, seeds: int = 60) -> Iterator[tuple[str, list[str]]]:
    """(label, pieces): whole, per character, per token, seeded random chunks, every two-piece split."""
    yield "whole", [text]
    yield "chars", list(text)
    yield "tokens", token_pieces(text)
    for seed in range(seeds):
        yield f"random[{seed}]", random_pieces(text, random.Random(seed))
    for cut in range(1, len(text)):
        yield f"split[{cut}]", [text[:cut], text[cut:]]


def openai_id(call_id: str) -> bool:
    return call_id.startswith("call_") and len(call_id) == 29 and call_id[5:].isalnum()


def drive(parser: OutputParser, pieces: list[str], *,
          id_ok: Callable[[str], bool] = openai_id) -> tuple[Final, list[ParsedDelta]]:
    """Push the pieces, flush, and check the deltas reassemble to the final result."""
    deltas = [parser.push(piece) for piece in pieces]
    deltas.append(parser.flush())
    return reassemble(parser, deltas, id_ok=id_ok), deltas


def reassemble(parser: OutputParser | TokenOutputParser, deltas: list[ParsedDelta], *,
               id_ok: Callable[[str], bool] = openai_id) -> Final:
    """What a client of these deltas ends with, checked against the parser's final calls: each call
    begins once, in order, with its id and name, and its streamed arguments join to the final ones."""
    calls = parser.calls()
    seen: dict[int, list[str]] = {}
    for delta in deltas:
        for piece in delta.tool_calls:
            if piece.index not in seen:
                assert piece.index == len(seen), f"call {piece.index} began before call {len(seen)}"
                assert piece.id == calls[piece.index].id and piece.name == calls[piece.index].name, piece
                seen[piece.index] = []
            else:
                assert piece.id is None and piece.name is None, f"a later delta repeats id or name: {piece}"
            seen[piece.index].append(piece.arguments)
    assert len(seen) == len(calls), "a call was never streamed"
    for index, call in enumerate(calls):
        assert id_ok(call.id), call.id
        assert "".join(seen[index]) == call.arguments, f"call {index}: streamed arguments differ from final"
    return Final("".join(d.content for d in deltas), "".join(d.reasoning for d in deltas),
                 tuple((c.name, c.arguments) for c in calls))


def check_all_ways(make: Callable[[], OutputParser], text: str, expected: Final, *, tags_are_real: bool = True,
                   seeds: int = 60, id_ok: Callable[[str], bool] = openai_id) -> int:
    """Every splitting gives `expected`; with real tags no content piece holds a tag fragment."""
    runs = 0
    for label, pieces in splittings(text, seeds=seeds):
        final, deltas = drive(make(), pieces, id_ok=id_ok)
        assert final == expected, f"{label}: {pieces!r}"
        if tags_are_real:
            for delta in deltas:
                for piece in (delta.content, delta.reasoning):
                    assert not any(tag in piece for tag in TAGS), f"{label}: a tag leaked into {piece!r}"
        runs += 1
    return runs


def args(obj: dict[str, Any]) -> str:
    """Arguments as the model writes them and as they come out: json.dumps, unicode kept."""
    return json.dumps(obj, ensure_ascii=False)


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args(arguments)}}}\n</tool_call>'
