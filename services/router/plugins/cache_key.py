"""What a cached answer is filed under (router process, the semantic cache's request hook): the scope
(whose it is and everything that changes an answer but the last user turn), the exact key (the whole
conversation), the text a semantic match compares, and what the cache never serves."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from services.router.plugins.hooks import Exchange

# Bumped when the encoding below changes: entries filed under an older one are then never found (and age out).
KEY_VERSION = 1
# Upstream fields that do not change the answer's text, left out of the scope so that they do not split
# the cache: how the answer is delivered (stream, stream_options), who asks (user, metadata, safety_identifier:
# the owner covers isolation), and bookkeeping for upstream (store, service_tier, priority, request_id,
# prompt_cache_key, cache_salt: prefix caching and scheduling, never the tokens). `model` is the public name,
# which the entry already is. Every other field is in the scope, unknown ones too: a field that changes
# nothing only splits the cache, a field left out would serve a wrong answer.
NEUTRAL_FIELDS = frozenset({"model", "messages", "prompt", "stream", "stream_options", "user", "metadata",
                            "safety_identifier", "store", "service_tier", "priority", "request_id",
                            "prompt_cache_key", "cache_salt"})
# Requests whose answer carries what the recorder does not keep (per-token logprobs, token ids): never served
# from the cache, never stored.
UNCACHED_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs", "return_token_ids")
# A last user turn longer than this is matched exactly only: sentence-embedding models read a few hundred
# tokens of it, so two long texts that differ past that would look alike.
MAX_SEMANTIC_CHARS = 4000

# Sorted keys: the same object always encodes to the same bytes, whatever order the client wrote it in.
_encode = msgspec.json.Encoder(order="sorted").encode


@dataclass(frozen=True, slots=True)
class CacheKey:
    scope: str  # the store scope: a digest of the owner and of everything that changes the answer but `text`
    key: str  # a digest of the whole conversation (or prompt), within the scope
    text: str | None  # the last user turn a semantic match compares; None: exact hits only


def uncached_reason(chat: dict[str, Any], chat_api: bool) -> str | None:
    """The field that keeps this request out of the cache, or None. Completions' `logprobs` is a count
    (0 asks for the chosen token's), chat's a boolean."""
    for name in UNCACHED_FIELDS:
        value = chat.get(name)
        if value is None or value is False or (name == "top_logprobs" and value == 0 and chat_api):
            continue
        return name
    return None


def cache_key(exchange: Exchange, shared: bool) -> CacheKey:
    """The request's place in the cache. Every part is encoded as one JSON value (strings escaped, lists
    delimited), never joined as text, so that no `user`, model or message can be written to reproduce
    another tenant's encoding; the digests are SHA-256 of that encoding."""
    chat = exchange.chat
    owner: dict[str, Any] = {"shared": True} if shared else {"tenant": exchange.tenant, "user": exchange.user}
    # A null field is an absent one, as OpenAI's APIs read it.
    fields = {name: value for name, value in chat.items() if name not in NEUTRAL_FIELDS and value is not None}
    whole: Any
    if exchange.chat_api:
        messages = chat.get("messages")
        whole = messages if isinstance(messages, list) else None
        context, text = _split_chat(whole or [])
    else:
        whole = chat.get("prompt")
        context, text = None, _prompt_text(whole)
    if text is None or not text.strip() or len(text) > MAX_SEMANTIC_CHARS:
        context, text = {"whole": whole}, None  # no usable turn to compare: the whole conversation is the scope
    scope = [KEY_VERSION, owner, exchange.entry, exchange.decision, exchange.chat_api, fields, context]
    return CacheKey(_digest(scope), _digest([KEY_VERSION, whole]), text)


def _digest(value: Any) -> str:
    return hashlib.sha256(_encode(value)).hexdigest()


def _split_chat(messages: list[Any]) -> tuple[Any, str | None]:
    """(The conversation but the last user turn's text, that text), or (None, None) without a user turn
    of text. The context keeps every message before and after that turn, and the turn itself without its
    text parts (an image in it must match too)."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            text, rest = _text_of(message.get("content"))
            if text is None:
                return None, None
            turn = {**{k: v for k, v in message.items() if k != "content"}, "content": rest}
            return {"before": messages[:i], "turn": turn, "after": messages[i + 1:]}, text
    return None, None


def _text_of(content: Any) -> tuple[str | None, list[Any]]:
    """A user message's text (text parts joined by newlines, as upstream's templates join them) and its
    other parts; None when it has no text."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return None, []
    texts, rest = [], []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            rest.append(part)
    return ("\n".join(texts) if texts else None), rest


def _prompt_text(prompt: Any) -> str | None:
    """A completions prompt's text: a string, or a list of one string; token ids are matched exactly only."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    return None
