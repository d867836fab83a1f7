"""Anthropic's POST /v1/messages/count_tokens, run in the router: the Messages request (without
max_tokens) as the chat form of a replica's POST /tokenize, and its count as {"input_tokens": N}.

Counted by a replica of the pool the request would go to, not here: the count must be the prompt the
replica's own chat template renders and its tokenizer encodes (the frontend's minijinja renderer and
HF tokenizer), and the router may not import the frontend; a second renderer kept in step with it
would drift. A fleet frontend serves /tokenize, and so does vLLM. docs/router.md says more."""
from __future__ import annotations

from typing import Any

import msgspec

from services.router.listeners.codecs.anthropic import MessagesStream, anthropic_error, refusal_body
from services.router.listeners.codecs.anthropic_request import messages_to_chat
from services.router.listeners.codecs.codec import Codec

TOKENIZE_PATH = "/tokenize"
_NO_LIMIT = 2**31 - 1  # count_tokens takes no max_tokens; this one bounds nothing but thinking's budget
# What the chat form of /tokenize renders with (tool_choice and sampling do not change the prompt).
_RENDERED = ("tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")
_decode = msgspec.json.Decoder()
_json = msgspec.json.Encoder()


def count_to_tokenize(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens body as /tokenize's chat form, checked as a Messages request is (CodecError names
    the field); max_tokens and stream are not count_tokens fields, so whatever is sent for them is ignored."""
    chat = messages_to_chat({**body, "max_tokens": _NO_LIMIT, "stream": None} if isinstance(body, dict) else body)
    out = {"model": chat["model"], "messages": chat["messages"]}
    out.update((key, chat[key]) for key in _RENDERED if key in chat)
    return out


def tokenize_to_count(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The replica's /tokenize answer as Anthropic's count; a body without an integer count is the replica's fault."""
    count = answer["count"]
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"/tokenize answered a count that is no integer: {count!r}")
    return {"input_tokens": count}


def _refusal(status: int, raw: bytes) -> bytes:
    """Upstream's refusal in Anthropic's shape; a 404 says what the replica lacks when it is the route."""
    if status != 404:
        return refusal_body(status, raw)
    message = _decode.decode(refusal_body(status, raw))["error"]["message"]
    return _json.encode(anthropic_error(404, f"counting tokens needs the replica's POST {TOKENIZE_PATH} (a fleet "
                                             f"frontend or vLLM serves it); it answered: {message}"))


COUNT_TOKENS = Codec("count_tokens", "/v1/messages/count_tokens", count_to_tokenize, tokenize_to_count,
                       MessagesStream, lambda status, message, param: anthropic_error(status, message),
                       _refusal, upstream_path=TOKENIZE_PATH, part_of="messages", judged=False,
                       bulk=("messages", "system"))
