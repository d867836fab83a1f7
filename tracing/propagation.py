"""W3C trace context (`traceparent`, `tracestate`) read from and written to what carries it between the
fleet's processes: HTTP headers (ASGI's byte pairs, a client's dict), gRPC metadata, and the engine
protocol's GenerateRequest.trace_headers. Used by the router, the frontend and the engine alike."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar

from opentelemetry.context import Context
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_W3C = TraceContextTextMapPropagator()
# Tracing off: the client's own trace context of the request in hand, forwarded as it came.
_PASSED: ContextVar[dict[str, str] | None] = ContextVar("tracing_passed", default=None)


def carrier_of(headers: Iterable[tuple[bytes, bytes]] | Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The trace context headers among ASGI headers (lower-case byte pairs) or gRPC metadata (str keys)."""
    found: dict[str, str] = {}
    for key, value in headers:
        name = key.decode("latin-1") if isinstance(key, bytes) else key.lower()
        if name == TRACEPARENT or name == TRACESTATE:
            found[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    return found


def context_of(carrier: Mapping[str, str] | None) -> Context | None:
    """The remote parent a carrier names, or None (no traceparent, or one that does not parse: a new
    trace starts, as the W3C spec asks)."""
    if not carrier or TRACEPARENT not in carrier:
        return None
    context = _W3C.extract(carrier)
    return context if context else None


def headers_of(span: Span) -> dict[str, str]:
    """`span` as the parent named in W3C headers, for the next hop."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, set_span_in_context(span))
    return carrier


def pass_through(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """A service that does not trace still forwards a client's trace context, as W3C asks of every hop:
    kept for this request (its task and those it starts) until `passed` reads it for the next hop."""
    for key, _ in headers:
        if key == b"traceparent":
            _PASSED.set(carrier_of(headers))
            return


def passed() -> dict[str, str] | None:
    """The trace context `pass_through` kept for this request, or None."""
    return _PASSED.get()
