"""The `deepseek_r1` reasoning parser: the output is reasoning until `</think>` (the R1 templates
open `<think>` in the prompt; one the model writes itself at the start is dropped), then content.
Without `</think>` all of it is reasoning, as in vLLM. Runs in frontend API-server processes."""
from __future__ import annotations

from services.frontend.parsers.think import ThinkParser

__all__ = ["deepseek_r1"]


def deepseek_r1(prompt: str = "") -> ThinkParser:
    return ThinkParser(starts_in_reasoning=True)
