"""The LLM judge of both escalate algorithms (router process): the prompt it is asked and the strict
reading of its reply. It may pick one of the complete answers already received, or abstain."""
from __future__ import annotations

from typing import Any, Protocol


class JudgeCaller(Protocol):
    """Asks a chat pool (the judge's) one non-streamed chat completion; returns the reply's text.
    Raises TimeoutError past `timeout_s`, or any error the pool gave (the judge then abstains)."""

    async def ask(self, pool: str, messages: list[dict[str, Any]], *, timeout_s: float) -> str: ...
