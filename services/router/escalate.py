"""The escalate algorithm's pure parts, run in the router process: whether a stage's answer is
accepted, and how a whole answer is replayed as a stream for a client that asked for one (a stage
is called without streaming, because its answer is judged whole before the client sees any of it)."""
from __future__ import annotations

from typing import Any

from services.router.config import AcceptConfig


def answer_text(completion: dict[str, Any]) -> tuple[str, str | None]:
    """The first choice's text and finish_reason, for chat and completions bodies alike."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return (text if isinstance(text, str) else ""), choice.get("finish_reason")


def verdict(accept: AcceptConfig, completion: dict[str, Any]) -> str | None:
    """None when the answer is accepted, else why not (one line, for the log and the response)."""
    text, finish = answer_text(completion)
    if finish not in accept.finish_reasons:
        return f"finish_reason {finish!r} not in {list(accept.finish_reasons)}"
    if len(text) < accept.min_chars:
        return f"{len(text)} chars < min_chars {accept.min_chars}"
    if accept.compiled is not None and not accept.compiled.search(text):
        return f"no match for {accept.regex!r}"
    return None


def as_chunks(completion: dict[str, Any], *, chat: bool, include_usage: bool) -> list[dict[str, Any]]:
    """A non-streamed chat or completions body as the chunks a stream of it would have carried."""
    base = {"id": completion.get("id", ""), "created": completion.get("created", 0),
            "model": completion.get("model", ""),
            "object": "chat.completion.chunk" if chat else "text_completion"}
    chunks: list[dict[str, Any]] = []
    for i, choice in enumerate(completion.get("choices") or ()):
        index = choice.get("index", i)
        if chat:
            message = choice.get("message") or {}
            delta = {"role": message.get("role", "assistant"), "content": message.get("content") or ""}
            chunks.append({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
            chunks.append({**base, "choices": [{"index": index, "delta": {},
                                                "finish_reason": choice.get("finish_reason")}]})
        else:
            chunks.append({**base, "choices": [{"index": index, "text": choice.get("text") or "",
                                                "finish_reason": choice.get("finish_reason")}]})
    if include_usage and completion.get("usage"):
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks
