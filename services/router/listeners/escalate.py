"""The escalate algorithm, run in the router process: stages called in order, each answer judged whole
(`verdict`), and the first accepted one (or the last one got within the deadline and call cap) sent to
the client, replayed as a stream (`as_chunks`) for a client that asked for one. A stage is called
without streaming, because its answer is judged whole before the client sees any of it."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import Send

from services.router.backends.dispatch import SSE, Call, Dispatcher, Opened
from services.router.backends.upstream import READ_ERRORS, UpstreamError, decode_object, shaped
from services.router.config import AcceptConfig, EscalateAlgorithm
from services.router.listeners.asgi import HTTPError
from services.router.listeners.codecs.codec import CHAT_PATH
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")


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
            for delta in _deltas(message):
                chunks.append({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
            chunks.append({**base, "choices": [{"index": index, "delta": {},
                                                "finish_reason": choice.get("finish_reason")}]})
        else:
            chunks.append({**base, "choices": [{"index": index, "text": choice.get("text") or "",
                                                "finish_reason": choice.get("finish_reason")}]})
    if include_usage and completion.get("usage"):
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks


def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole message as a stream's deltas, in the order a stream sends them: reasoning, content,
    then each tool call whole (its first delta, with all its arguments)."""
    role = message.get("role", "assistant")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    if not reasoning and not calls:
        return [{"role": role, "content": message.get("content") or ""}]
    deltas: list[dict[str, Any]] = []
    if reasoning:
        deltas.append({"role": role, "reasoning_content": reasoning})
    if message.get("content") or not deltas:
        deltas.append({"content": message.get("content") or "", **({} if deltas else {"role": role})})
    deltas.extend({"tool_calls": [{"index": j, **call}]} for j, call in enumerate(calls))
    return deltas


class Escalator:
    def __init__(self, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics

    async def escalate(self, call: Call, algorithm: EscalateAlgorithm, send: Send) -> None:
        """Stages in order until one is accepted; the client is told which stage answered."""
        # The loop's clock, the one its timers fire by (uvloop's lags time.monotonic() a little).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + algorithm.deadline_s
        calls, answer, refusal = 0, None, None
        payloads: dict[str, bytes] = {}
        for stage in algorithm.stages:
            if calls >= algorithm.max_calls or loop.time() >= deadline:
                break
            calls += 1
            opened: Opened | None = None
            outcome: bool | None = None  # for the replica's breaker: a passed deadline says nothing
            shared = asyncio.timeout_at(deadline)
            try:
                async with shared:
                    # The shared deadline is this timeout's: a shorter one inside would fail the stage
                    # a moment early and leave a sliver of time for the next stage to be called in.
                    opened = await self.dispatcher.open_any(call, (stage,), payloads, stream=False)
                    raw = await opened.response.read()
                status = opened.response.status
                completion = decode_object(raw) if status == 200 else {}
                outcome = True
            except HTTPError as exc:
                refusal = exc
                log.info("escalate %s: stage %s refused: %s", call.choice.entry.name, stage, exc.message)
                continue
            except (*READ_ERRORS, UpstreamError) as exc:
                if shared.expired():  # the shared deadline, not the replica (its own read timeout is a failure)
                    refusal = HTTPError(504, f"stage {stage!r}: no answer within the {algorithm.deadline_s}s deadline")
                    continue
                outcome = False
                self.metrics.upstream_errors.labels(stage).inc()
                log.warning("escalate %s: stage %s failed: %s", call.choice.entry.name, stage, exc)
                refusal = HTTPError(502, f"stage {stage!r}: {exc}")
                continue
            finally:
                if opened is not None:
                    opened.response.close()
                    opened.lease.release(outcome)
            if status != 200:
                refusal = HTTPError(status if status < 500 else 502, f"stage {stage!r} answered HTTP {status}: "
                                    f"{raw[:300].decode(errors='replace')}")
                continue
            why = verdict(algorithm.accept, completion)
            answer = (stage, opened, completion, why)
            if why is None:
                break
            self.metrics.escalations.labels(call.choice.entry.name, stage).inc()
            log.info("escalate %s: stage %s not accepted: %s", call.choice.entry.name, stage, why)
        if answer is None:
            raise refusal or HTTPError(504, f"no stage answered within {algorithm.deadline_s}s")
        stage, opened, completion, why = answer
        call.headers += [(b"x-router-pool", stage.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode()),
                         (b"x-router-stage", stage.encode()), (b"x-router-calls", str(calls).encode()),
                         (b"x-router-accepted", b"true" if why is None else b"false")]
        call.escalation = {"stage": stage, "calls": calls, "accepted": why is None, "reason": why}
        try:
            await self._send(call, completion, send)
        except UpstreamError as exc:  # the answer's shape is not a completion's: the replica's fault
            raise HTTPError(502, f"stage {stage!r}: {exc}") from None

    async def _send(self, call: Call, completion: dict[str, Any], send: Send) -> None:
        if not call.chat.get("stream"):
            await self.dispatcher.send_adapted(call, completion, send)
            return
        options = call.chat.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = shaped(as_chunks, completion, chat=call.adapter.upstream_path == CHAT_PATH, include_usage=usage)
        stream = call.adapter.stream(call.request)
        body = stream.start() + b"".join(shaped(stream.feed, c) for c in chunks) + stream.finish()
        await call.start(send, 200, SSE)
        await send({"type": "http.response.body", "body": body, "more_body": False})
