"""The LLM judge of both escalate algorithms (router process): the prompt it is asked and the strict
reading of its reply. It may pick one of the complete answers already received, or abstain."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from services.router.runtime.models import Label

# What one option may show of a chat answer: enough to judge it by, little enough to keep the judge's
# prompt (and its cost) small whatever the stages wrote.
OPTION_CHARS = 2000
INPUT_CHARS = 4000
ABSTAIN = "abstain"
_NUMBER = re.compile(r"[0-9]+")


class JudgeCaller(Protocol):
    """Asks a chat pool (the judge's) one non-streamed chat completion; returns the reply's text.
    Raises TimeoutError past `timeout_s`, or any error the pool gave (the judge then abstains)."""

    async def ask(self, pool: str, messages: list[dict[str, Any]], *, timeout_s: float) -> str: ...


def prompt(family: str, input_description: str, answers: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The judge's messages. `family`: chat, classifier or cross_encoder; `input_description`: what was
    asked (cut by the caller, who knows which end matters: INPUT_CHARS); `answers`: (stage, what it
    answered: `option` or `chat_option`) per option, in stage order (numbered from 1)."""
    n = len(answers)
    numbers = "1" if n == 1 else f"one of 1 to {n}"
    system = (f"You are a judge. Several models answered the same {_task(family)}; none was confident. "
              "Pick the answer that is most likely correct, or abstain if you cannot tell. "
              f"Reply with exactly {numbers} (the option's number) or the word {ABSTAIN}, and nothing else.")
    options = "\n\n".join(f"Option {i} (from {stage}):\n{text}" for i, (stage, text) in enumerate(answers, 1))
    user = f"Input:\n{input_description}\n\n{options}\n\nYour choice ({numbers} or {ABSTAIN}):"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def read(reply: str, n_options: int) -> int | None:
    """The chosen option's index (0-based) in the answers offered, or None: abstained. Strict: the reply,
    stripped, must be exactly a number 1..n_options or the word abstain (any case), or a JSON object
    {"choice": n | "abstain"} and nothing else; any other reply (extra words, two numbers, a number out
    of range) is garbled, read as abstaining: a guess at what the judge meant is not the judge's choice."""
    text = reply.strip()
    choice: Any = text
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or set(value) != {"choice"}:
            return None
        choice = value["choice"]
        if isinstance(choice, bool) or not isinstance(choice, (int, str)):
            return None
        if isinstance(choice, int):
            return choice - 1 if 1 <= choice <= n_options else None
        if choice.lower() != ABSTAIN:
            return None  # a number in a string is not the form asked for
    if not isinstance(choice, str) or choice.lower() == ABSTAIN or not _NUMBER.fullmatch(choice):
        return None
    number = int(choice)
    return number - 1 if 1 <= number <= n_options else None


def option(output: Label | tuple[float, ...], documents: Sequence[str] = ()) -> str:
    """A System One answer as the judge sees it: a classifier's labels by probability, or a
    cross-encoder's best document and score, then the rest by score."""
    if isinstance(output, Label):
        ranked = sorted(output.probs.items(), key=lambda kv: kv[1], reverse=True)
        others = ", ".join(f"{name} {p:.3f}" for name, p in ranked if name != output.label)
        top = f"label {output.label} (probability {output.probability:.3f})"
        return top + (f"; others: {others}" if others else "")
    order = sorted(range(len(output)), key=output.__getitem__, reverse=True)
    if not order:
        return "no scores"
    best = order[0]
    text = f"best document #{best + 1} (score {output[best]:.3f})"
    if best < len(documents):
        text += f": {cut(documents[best], OPTION_CHARS)}"
    rest = ", ".join(f"#{i + 1} {output[i]:.3f}" for i in order[1:])
    return text + (f"; others by score: {rest}" if rest else "")


def chat_option(text: str) -> str:
    """A chat answer as the judge sees it: its text, cut to OPTION_CHARS."""
    return cut(text, OPTION_CHARS)


def _task(family: str) -> str:
    return {"classifier": "classification", "cross_encoder": "relevance ranking of documents for a query"}.get(
        family, "request")


def cut(text: str, limit: int, *, tail: bool = False) -> str:
    """`text`, or its first (`tail`: last) `limit` characters, marked as cut."""
    if len(text) <= limit:
        return text
    return "[...] " + text[-limit:] if tail else text[:limit] + " [...]"
