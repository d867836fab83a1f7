"""What memory and rag give the model (router process): recalled texts as one system message within a
token budget, merged into the request's first system message or put first, and the last user turn
they recall by. Tokens are estimated as ceil(chars / 4): the router holds no tokenizer of the model."""
from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from services.router.plugins.hooks import Exchange
from services.router.plugins.store.base import Item

SYSTEM_ROLES = ("system", "developer")  # developer: OpenAI's newer name for the system role
# A text cut to fit the budget keeps at least this many tokens, or is left out: a stub recalls nothing.
MIN_CUT_TOKENS = 16
ELLIPSIS = "…"
T = TypeVar("T")


def estimate_tokens(text: str) -> int:
    """About four characters a token for English under the common BPE vocabularies; an overestimate for
    code and most scripts' single characters is what a budget wants."""
    return math.ceil(len(text) / 4)


def text_of(content: Any) -> str:
    """A message's text: a string as it is; content parts' texts joined by newlines (images and the like
    have none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"])
    return ""


def last_user_text(messages: Any) -> str:
    """The text of the last user message ("" when there is none, or it has no text)."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message.get("content")).strip()
    return ""


def within_budget(preamble: str, entries: Sequence[str], max_tokens: int) -> tuple[str, int]:
    """The preamble and as many entries, in order, as fit `max_tokens` together (blank lines between);
    the first entry that does not fit whole is cut to what is left (at least MIN_CUT_TOKENS, else left
    out) and ends the list. Returns the text and how many entries it holds ("", 0: none fit)."""
    parts = [preamble]
    used = estimate_tokens(preamble)
    for entry in entries:
        cost = estimate_tokens("\n\n" + entry)
        if used + cost <= max_tokens:
            parts.append(entry)
            used += cost
            continue
        room = (max_tokens - used) * 4 - len("\n\n" + ELLIPSIS)
        if room >= MIN_CUT_TOKENS * 4:
            parts.append(cut(entry, room) + ELLIPSIS)
        break
    if len(parts) == 1:
        return "", 0
    return "\n\n".join(parts), len(parts) - 1


def cut(text: str, chars: int) -> str:
    """`text` to at most `chars` characters, at a boundary() (see there)."""
    return text if len(text) <= chars else text[:boundary(text, chars)]


def boundary(text: str, i: int) -> int:
    """The last place at or before `i` (0 < i < len(text)) where `text` may be cut without parting a
    character from the marks or joiners that compose with it (an accent, a ZWJ emoji sequence, a skin
    tone, a variation selector, a flag's pair); `i` itself when the text before it is one such cluster."""
    end = i
    while end > 0 and (_joins(text[end]) or text[end - 1] == "\u200d" or _inside_flag(text, end)):
        end -= 1
    return end if end > 0 else i


def _joins(char: str) -> bool:
    """A character that belongs to the one before it."""
    return (char == "\u200d" or "\ufe00" <= char <= "\ufe0f" or "\U0001f3fb" <= char <= "\U0001f3ff"
            or unicodedata.combining(char) != 0 or unicodedata.category(char) in ("Mn", "Mc", "Me"))


def _inside_flag(text: str, end: int) -> bool:
    """Between the two regional indicators of one flag (they pair from the start of their run)."""
    if not (_regional(text[end]) and _regional(text[end - 1])):
        return False
    run = end
    while run > 0 and _regional(text[run - 1]):
        run -= 1
    return (end - run) % 2 == 1


def _regional(char: str) -> bool:
    return "\U0001f1e6" <= char <= "\U0001f1ff"


def with_system(messages: list[Any], text: str) -> list[Any]:
    """`messages` (not changed) with `text` appended to the first system message, or put first as a
    system message of its own when there is none: many chat templates take a system message only first."""
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            content = message.get("content")
            if isinstance(content, list):
                merged: Any = [*content, {"type": "text", "text": text}]
            else:
                merged = f"{content}\n\n{text}" if isinstance(content, str) and content else text
            return [*messages[:i], {**message, "content": merged}, *messages[i + 1:]]
    return [{"role": "system", "content": text}, *messages]


def recall_query(exchange: Exchange, outcome: str) -> tuple[list[Any], str] | None:
    """The request's messages and the text to recall by (its last user turn); None, noted as `skipped`
    under `outcome`, for a text completion (no messages) or a request with no user turn."""
    messages = exchange.chat.get("messages")
    text = last_user_text(messages) if exchange.chat_api else ""
    if not text:
        exchange.notes[outcome] = "skipped"
        return None
    assert isinstance(messages, list)  # last_user_text found a user message in it
    return messages, text


def decoded(found: Sequence[tuple[float, Item]], shape: type[T]) -> list[T]:
    """The payloads of `found`, nearest first, as `shape`; one this version did not write is left out."""
    out = []
    for _, item in found:
        try:
            out.append(msgspec.json.decode(item.payload, type=shape))
        except msgspec.DecodeError:
            continue
    return out


def give(exchange: Exchange, outcome: str, messages: list[Any], preamble: str, texts: Sequence[str],
         max_tokens: int) -> int:
    """The texts that fit `max_tokens` given to the model in the system message, and the outcome noted
    (`recalled`, or `none` when none fits or none was found); how many were given."""
    block, used = within_budget(preamble, texts, max_tokens)
    if not used:
        exchange.notes[outcome] = "none"
        return 0
    exchange.chat["messages"] = with_system(messages, block)
    exchange.notes[outcome] = "recalled"
    return used
