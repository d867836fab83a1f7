"""Signal results, the text signals look at, and the rule signals (keyword, regex, context_length)
evaluated on it. Runs in the router process, once per request. Pure, no I/O: the token counter is
loaded once at start (`tokenizer_counter`) and passed in. Signals answered by a model are
model_signals.py's."""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import checkpoints
from prompting.model_files import load_tokenizer
from services.router.config import (
    ContextLengthSignal,
    KeywordSignal,
    RegexSignal,
)

RuleSignal = KeywordSignal | RegexSignal | ContextLengthSignal


@dataclass(slots=True, frozen=True)
class SignalResult:
    type: str
    matched: bool  # False when unknown: decisions treat an unknown signal as neither true nor false
    detail: str  # one short line for humans, e.g. "matched 'urgent'"
    score: float | None = None  # a model signal's similarity, probability or relevance; None for rule signals
    worker: str | None = None  # the model signal's worker that answered ("in-process" for the local embedder)
    latency_s: float | None = None  # that call, as the router saw it
    reason: str | None = None  # set only when unknown: why the signal has no value (failed, timed out)
    label: str | None = None  # classifier and domain: the top label (the domain)

    @property
    def unknown(self) -> bool:
        return self.reason is not None


def unknown(signal_type: str, reason: str) -> SignalResult:
    """The result of a signal whose model did not answer in time, or could not."""
    return SignalResult(signal_type, False, f"unknown: {reason}", reason=reason)


def request_text(body: dict[str, Any]) -> str:
    """The text signals look at: every chat message's text, or the completions prompt, "\\n"-joined.

    Parts that are not text (images, tool calls, token ids) are skipped; a malformed body gives "".
    """
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        texts = (_content_text(m.get("content")) for m in messages if isinstance(m, dict))
        return "\n".join(t for t in texts if t)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # a batch of strings; token ids (ints, lists of ints) carry no text
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(part, dict)
                         and part.get("type") == "text" and isinstance(part.get("text"), str))
    return ""


def tokenizer_counter(spec: str) -> Callable[[str], int]:
    """A token counter from the tokenizer.json of checkpoint `spec` (a --model value). Reads the file."""
    tokenizer = load_tokenizer(checkpoints.resolve(spec)).tokenizer

    def count(text: str) -> int:
        # encode_batch_fast releases the GIL while it works (encode holds it throughout: a 3 MB text
        # stalled every stream 4.3 s, though it ran in a worker thread), and skips the offsets.
        return len(tokenizer.encode_batch_fast([text], add_special_tokens=False)[0])

    return count


def approx_tokens(text: str) -> int:
    """Token count without a tokenizer: UTF-8 bytes / 4, rounded up.

    BPE vocabularies of current LLMs average about 4 bytes per token on English text; code and
    non-Latin scripts give more tokens per byte, so set a pool `tokenizer` when exact limits matter.
    """
    return -(-len(text.encode("utf-8")) // 4)


def evaluate_rules(signals: list[RuleSignal], text: str, *,
                   token_count: Callable[[str], int] | None = None) -> dict[str, SignalResult]:
    """Each rule signal on `text`, by name, in the order given. `token_count` defaults to `approx_tokens`."""
    return {signal.name: evaluate_rule(signal, text, token_count) for signal in signals}


def evaluate_rule(signal: RuleSignal, text: str, token_count: Callable[[str], int] | None = None) -> SignalResult:
    if isinstance(signal, KeywordSignal):
        return _keyword(signal, text)
    if isinstance(signal, RegexSignal):
        found = signal.compiled.search(text)
        if found:
            return SignalResult(signal.type, True, f"matched {short(found.group(0))}")
        return SignalResult(signal.type, False, f"no match for /{signal.pattern}/")
    tokens = token_count(text) if token_count else approx_tokens(text)
    how = "tokenizer" if token_count else "approx. bytes/4"
    high = float("inf") if signal.max_tokens is None else signal.max_tokens
    matched = signal.min_tokens <= tokens < high
    span = f"[{signal.min_tokens}, {'inf' if signal.max_tokens is None else signal.max_tokens})"
    verdict = "in" if matched else "not in"
    return SignalResult(signal.type, matched, f"{tokens} tokens ({how}) {verdict} {span}")


def _keyword(signal: KeywordSignal, text: str) -> SignalResult:
    hits = [kw for kw, pattern in zip(signal.keywords, _keyword_patterns(signal), strict=True) if pattern.search(text)]
    if signal.mode == "any":
        if hits:
            return SignalResult(signal.type, True, f"matched {short(hits[0])}")
        return SignalResult(signal.type, False, "no keyword matched")
    missing = [kw for kw in signal.keywords if kw not in hits]
    if missing:
        return SignalResult(signal.type, False, f"missing {', '.join(map(short, missing))}")
    return SignalResult(signal.type, True, f"matched all {len(hits)} keywords")


@functools.cache
def _keyword_patterns(signal: KeywordSignal) -> tuple[re.Pattern[str], ...]:
    """One pattern per keyword, compiled on a signal's first use (signals are fixed by the config).

    An end of a keyword that is a word character must sit on a word boundary, so "art" does not
    match "start" and "gpt-4" does not match "gpt-40"; an end that is punctuation needs no boundary,
    so "c++" matches "c++17". Lookarounds rather than \\b keep that true for such keywords.
    """
    flags = 0 if signal.case_sensitive else re.IGNORECASE
    patterns = []
    for keyword in signal.keywords:
        head = r"(?<!\w)" if re.match(r"\w", keyword) else ""
        tail = r"(?!\w)" if re.search(r"\w\Z", keyword) else ""
        patterns.append(re.compile(head + re.escape(keyword) + tail, flags))
    return tuple(patterns)


def short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")
