"""The `qwen3` reasoning parser: `<think>reasoning</think>content`, where the chat template may
have opened `<think>` in the prompt already. Runs in frontend API-server processes.

vLLM's current parser assumes thinking is on unless the request sets enable_thinking=false, so an
output with no tags at all is reasoning there. This parser reads the rendered prompt instead: when
the prompt ends inside an open `<think>` (Qwen3.5-style templates, or a generation prompt ending
in `<think>\\n`) the output starts in reasoning; otherwise it is reasoning only if it begins with
`<think>`, and all content if no `<think>` appears (enable_thinking=false renders an empty, closed
think block into the prompt, so that case is content too). A missing `</think>` leaves everything
after `<think>` reasoning, as in vLLM. As in vLLM, a `<tool_call>` followed by `<function=` also
ends the reasoning (Qwen3.5 calling a tool without closing it) and the content begins at it.
"""
from __future__ import annotations

from services.frontend.parsers.think import ThinkParser, prompt_opens_think

__all__ = ["SEED_THINK", "qwen3", "seed_oss"]

SEED_THINK = ("<seed:think>", "</seed:think>")


def qwen3(prompt: str = "") -> ThinkParser:
    return ThinkParser(starts_in_reasoning=prompt_opens_think(prompt), tool_call_ends=True)


def seed_oss(prompt: str = "") -> ThinkParser:
    """`seed_oss` (Seed-OSS): qwen3's rule with `<seed:think>` and `</seed:think>`, as vLLM reads them."""
    return ThinkParser(starts_in_reasoning=prompt_opens_think(prompt, *SEED_THINK), tags=SEED_THINK)
