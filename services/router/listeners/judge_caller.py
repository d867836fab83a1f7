"""The judge asked over the chat pools (router process): one non-streamed chat completion to the judge's
pool through the dispatcher (its replica choice, retries before the first byte, 429 when full), at
temperature 0 and a few tokens, the pool's `model` sent upstream. Implements decision/judge.py's
JudgeCaller; every failure raises, and the caller abstains."""
from __future__ import annotations

import asyncio
from typing import Any

from services.router.backends.dispatch import Dispatcher, Opened
from services.router.backends.upstream import READ_ERRORS, UpstreamError, decode_object
from services.router.decision.algorithms import answer_text
from services.router.errors import HTTPError
from services.router.listeners.codecs.codec import CHAT_PATH

# The reply is an option's number or "abstain": a few tokens, with room for a tokenizer that splits them.
MAX_TOKENS = 16


class JudgeError(RuntimeError):
    """The judge's pool gave no usable reply: the message says which pool and why."""


class PoolJudge:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def ask(self, pool: str, messages: list[dict[str, Any]], *, timeout_s: float) -> str:
        """The reply's text; TimeoutError past `timeout_s`, JudgeError for any failure of the pool."""
        body = {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}
        # What the pool's policies read of the request (cache-aware placement): the options, in the user turn.
        text = str(messages[-1].get("content", "")) if messages else ""
        opened: Opened | None = None
        outcome: bool | None = None  # for the replica's breaker: a passed timeout says nothing of it
        limit = asyncio.timeout(timeout_s)
        try:
            async with limit:
                # No ticket: never queued. The stages' answer is in hand; waiting for a slot only delays it.
                opened = await self.dispatcher.open_any(body, text, CHAT_PATH, (pool,), {}, stream=False)
                raw = await opened.response.read()
            outcome = True
        except HTTPError as exc:  # no replica free, none ready, or it refused: no reply to read
            raise JudgeError(f"judge pool {pool!r}: {exc.message}") from None
        except (*READ_ERRORS, UpstreamError) as exc:
            if limit.expired():
                raise TimeoutError(f"judge pool {pool!r}: no reply within {timeout_s:.3g} s") from None
            outcome = False
            self.dispatcher.metrics.upstream_errors.labels(pool).inc()
            raise JudgeError(f"judge pool {pool!r}: {exc}") from None
        finally:
            if opened is not None:
                opened.response.close()
                opened.lease.release(outcome)
        status = opened.response.status
        if status != 200:
            raise JudgeError(f"judge pool {pool!r} answered HTTP {status}: {raw[:200].decode(errors='replace')}")
        try:
            reply, _ = answer_text(decode_object(raw))
        except UpstreamError as exc:
            raise JudgeError(f"judge pool {pool!r}: {exc}") from None
        return reply
