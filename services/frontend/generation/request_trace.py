"""One engine request's span in the frontend (`frontend.generate`, on the API server's event loop): opened
at submission as a child of the request's server span, its context carried to the engine in
GenerateRequest.trace_headers; the wait at the engine (`frontend.engine_queue`, from the engine's
queue time) and the time to the first token (`frontend.first_token`) recorded as children; ended with
the finish reason and token counts. Made only when tracing is on (launch asks tracing.enabled())."""
from __future__ import annotations

import time

import msgspec
from opentelemetry.trace import Span

import tracing
from protocol import RequestTimings
from services.frontend.requests.engine_request import EngineRequest


class RequestTrace:
    __slots__ = ("_ended", "_start_ns", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._start_ns = time.time_ns()
        self._ended = False

    @classmethod
    def start(cls, request: EngineRequest) -> RequestTrace | None:
        span = tracing.start_span("frontend.generate", attributes={
            "gen_ai.request.id": request.request_id, "gen_ai.usage.prompt_tokens": request.prompt_len,
            "gen_ai.request.max_tokens": request.max_tokens})
        return cls(span) if span is not None else None

    def carried(self, request: EngineRequest) -> EngineRequest:
        """The engine request with this span's context for the engine (protocol 1.6)."""
        traced = msgspec.structs.replace(request.request, trace_headers=tracing.headers_of(self.span))
        return msgspec.structs.replace(request, request=traced)

    def placed(self, rank: int) -> None:
        self.span.set_attribute("fleet.engine.rank", rank)

    def first_token(self) -> None:
        now = time.time_ns()
        tracing.record_span(self.span, "frontend.first_token", self._start_ns, now)

    def finish(self, reason: str, completion_tokens: int, cached_tokens: int, timings: RequestTimings | None) -> None:
        """Ended well: the engine's queue time (its own clock: from its arrival there until first scheduled)
        as a span from submission, and the answer's counts."""
        if self._ended:
            return
        if timings is not None:
            tracing.record_span(self.span, "frontend.engine_queue", self._start_ns,
                                self._start_ns + int(timings.queued_time * 1e9),
                                {"gen_ai.latency.time_in_queue": timings.queued_time})
        self.span.set_attributes({"gen_ai.response.finish_reasons": [reason],
                                  "gen_ai.usage.completion_tokens": completion_tokens,
                                  "gen_ai.usage.cached_tokens": cached_tokens})
        self._end()

    def fail(self, why: str, completion_tokens: int) -> None:
        if self._ended:
            return
        self.span.set_attribute("gen_ai.usage.completion_tokens", completion_tokens)
        tracing.fail(self.span, why)
        self._end()

    def close(self) -> None:
        """At the end of launch: a request that neither finished nor failed was left (its client went)."""
        if not self._ended:
            self.span.set_attribute("gen_ai.response.finish_reasons", ["abort"])
            self._end()

    def _end(self) -> None:
        self._ended = True
        self.span.end()
