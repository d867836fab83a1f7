"""A request's life in the engine core as one span (`engine.request`, in the rank process's core loop),
child of the frontend's span named by GenerateRequest.trace_headers: from its arrival to its finish,
with its phases as children (`engine.queued`, `engine.prefill`, `engine.decode`, from the backend's
RequestTimings, vLLM's own definitions) and the attributes vLLM's `llm_request` span carries. Made only
for a request that carries a trace context while this process traces."""
from __future__ import annotations

import time

from opentelemetry.trace import Span

import tracing
from protocol import GenerateRequest, RequestOutput


class EngineTrace:
    __slots__ = ("_arrival_ns", "_first_ns", "_tokens", "span")

    def __init__(self, span: Span, arrival_ns: int) -> None:
        self.span = span
        self._arrival_ns = arrival_ns
        self._first_ns = 0
        self._tokens = 0

    @classmethod
    def start(cls, request: GenerateRequest, rank: int) -> EngineTrace | None:
        now = time.time_ns()
        span = tracing.start_span("engine.request", parent=request.trace_headers, kind=tracing.SERVER, start_ns=now,
                                  attributes={"gen_ai.request.id": request.request_id, "fleet.engine.rank": rank,
                                              "gen_ai.usage.prompt_tokens": len(request.prompt_token_ids),
                                              "gen_ai.request.max_tokens": request.sampling.max_tokens})
        return cls(span, now) if span is not None else None

    def output(self, out: RequestOutput) -> bool:
        """One step's output for the request; True once it finished (the span ended)."""
        n = len(out.new_token_ids)
        timings = out.timings
        if n and not self._tokens:
            self._first_ns = time.time_ns()
            self.span.add_event("first_token", timestamp=self._first_ns)
            self.span.set_attribute("gen_ai.usage.cached_tokens", out.num_cached_tokens)
            if timings is not None:
                scheduled = self._arrival_ns + int(timings.queued_time * 1e9)
                tracing.record_span(self.span, "engine.queued", self._arrival_ns, scheduled,
                                    {"gen_ai.latency.time_in_queue": timings.queued_time})
                tracing.record_span(self.span, "engine.prefill", scheduled,
                                    scheduled + int(timings.prefill_time * 1e9),
                                    {"gen_ai.latency.time_in_model_prefill": timings.prefill_time})
        self._tokens += n
        if out.finish_reason is None:
            return False
        if timings is not None and self._first_ns:
            tracing.record_span(self.span, "engine.decode", self._first_ns,
                                self._first_ns + int(timings.decode_time * 1e9),
                                {"gen_ai.latency.time_in_model_decode": timings.decode_time,
                                 "fleet.num_preemptions": timings.num_preemptions})
        if out.finish_reason == "error":
            tracing.fail(self.span, out.error or "error")
        self.end(out.finish_reason)
        return True

    def end(self, reason: str, error: str | None = None) -> None:
        self.span.set_attributes({"gen_ai.response.finish_reasons": [reason],
                                  "gen_ai.usage.completion_tokens": self._tokens})
        if error is not None:
            tracing.fail(self.span, error)
        self.span.end()


def refused(request: GenerateRequest, rank: int, error: str) -> None:
    """A request the engine did not take: a span of its own, ended at once with the refusal."""
    trace = EngineTrace.start(request, rank)
    if trace is not None:
        trace.end("error", error)
