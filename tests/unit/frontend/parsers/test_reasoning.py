"""The qwen3 and deepseek_r1 reasoning parsers: reasoning and content as a client sees them, however
the output was split, and whether the prompt opened the reasoning."""
from __future__ import annotations

import pytest

from services.frontend.parsers import REASONING_PARSERS, build_parser
from services.frontend.parsers.deepseek_r1 import deepseek_r1
from services.frontend.parsers.qwen3 import qwen3
from services.frontend.parsers.think import prompt_opens_think
from tests.unit.frontend.parsers.harness import Final, check_all_ways

OPEN = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"  # template opened the reasoning
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking=false
PLAIN = "<|im_start|>assistant\n"

# (id, prompt, model output, final reasoning, final content, tags are real tags)
QWEN3 = [
    ("no tags is content", PLAIN, "Just an answer.", "", "Just an answer.", True),
    ("empty", PLAIN, "", "", "", True),
    ("think then answer", PLAIN, "<think>\nStep 1.\n</think>\n\nThe answer.", "\nStep 1.\n", "The answer.", True),
    ("leading whitespace before think", PLAIN, "\n <think>x</think>y", "x", "y", True),
    ("unicode", PLAIN, "<think>日本語 🎉 ü</think>Ça", "日本語 🎉 ü", "Ça", True),
    ("lookalike tags", PLAIN, "<think>a < b </thin k> <thinker></think>c </think> d", "a < b </thin k> <thinker>",
     "c </think> d", False),
    ("not a think tag", PLAIN, "<thinker> is no tag", "", "<thinker> is no tag", True),
    ("a late think is text", PLAIN, "Hi <think>x</think>", "", "Hi <think>x</think>", False),
    ("cut in reasoning", PLAIN, "<think>still thinking", "still thinking", "", True),
    ("cut in the end tag", PLAIN, "<think>abc</thi", "abc</thi", "", False),
    ("cut in the start tag", PLAIN, "<thi", "", "<thi", False),
    ("prompt opened it", OPEN, "Step 1.</think>\n\nAnswer", "Step 1.", "Answer", True),
    ("prompt opened it, model repeats it", OPEN, "<think>\nStep 1.</think>Answer", "\nStep 1.", "Answer", True),
    ("prompt opened it, cut", OPEN, "Step 1 and", "Step 1 and", "", True),
    ("prompt opened it, whitespace only", OPEN, "\n\n", "\n\n", "", True),
    ("thinking disabled", CLOSED, "Answer right away.", "", "Answer right away.", True),
    ("only reasoning then whitespace", PLAIN, "<think>r</think>\n\n", "r", "", True),
]

DEEPSEEK_R1 = [
    ("starts in reasoning", "Let me see.</think>The answer.", "Let me see.", "The answer.", True),
    ("model writes think", "<think>\nLet me see.\n</think>\n\nThe answer.", "\nLet me see.\n", "The answer.", True),
    ("never closed", "All of it is reasoning", "All of it is reasoning", "", True),
    ("empty", "", "", "", True),
    ("empty reasoning", "</think>Answer", "", "Answer", True),
    ("unicode", "ü🎉</think>日本", "ü🎉", "日本", True),
]


@pytest.mark.parametrize(("prompt", "text", "reasoning", "content", "real"), [c[1:] for c in QWEN3],
                         ids=[c[0] for c in QWEN3])
def test_qwen3_every_splitting(prompt: str, text: str, reasoning: str, content: str, real: bool) -> None:
    check_all_ways(lambda: qwen3(prompt), text, Final(content, reasoning, ()), tags_are_real=real)


@pytest.mark.parametrize(("text", "reasoning", "content", "real"), [c[1:] for c in DEEPSEEK_R1],
                         ids=[c[0] for c in DEEPSEEK_R1])
def test_deepseek_r1_every_splitting(text: str, reasoning: str, content: str, real: bool) -> None:
    for prompt in (PLAIN, OPEN):
        check_all_ways(lambda: deepseek_r1(prompt), text, Final(content, reasoning, ()), tags_are_real=real)  # noqa: B023


def test_the_prompt_opens_think_only_when_its_last_think_is_open() -> None:
    assert prompt_opens_think(OPEN)
    assert prompt_opens_think("<think>\n\n</think>old turn<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think(CLOSED)
    assert not prompt_opens_think(PLAIN)
    assert not prompt_opens_think("")


def test_a_partial_end_tag_is_held_as_reasoning_then_released() -> None:
    parser = qwen3(OPEN)
    first = parser.push("x </th")
    assert (first.reasoning, first.content) == ("x ", "")
    second = parser.push("ing")
    assert (second.reasoning, second.content) == ("</thing", "")
    last = parser.push("</think>\n\nok")
    assert (last.reasoning, last.content) == ("", "ok")


def test_reasoning_parsers_make_no_calls() -> None:
    for name in REASONING_PARSERS:
        parser = build_parser(None, name, prompt=OPEN)
        assert parser is not None
        parser.push("a</think>b")
        parser.flush()
        assert parser.calls() == []


SEED = [  # (id, prompt, model output, final reasoning, final content)
    ("think then answer", "", "<seed:think>Step 1.</seed:think>\n\nThe answer.", "Step 1.", "The answer."),
    ("opened by the prompt", "<seed:bos>assistant\n<seed:think>", "Step 1.</seed:think>Done.", "Step 1.", "Done."),
    ("qwen3's tags are text", "", "<think>not reasoning</think>", "", "<think>not reasoning</think>"),
    ("never closed", "", "<seed:think>still", "still", ""),
]


@pytest.mark.parametrize(("prompt", "text", "reasoning", "content"), [c[1:] for c in SEED], ids=[c[0] for c in SEED])
def test_seed_oss_is_qwen3s_rule_in_seed_tags(prompt: str, text: str, reasoning: str, content: str) -> None:
    check_all_ways(lambda: build_parser(None, "seed_oss", prompt=prompt), text, Final(content, reasoning, ()),  # type: ignore
                   tags_are_real=False, seeds=20)
