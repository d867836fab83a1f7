"""One OpenTelemetry trace per request across the fleet's processes: the settings (OTEL_* environment,
--otlp-traces-endpoint), the process's tracer and the W3C propagation the router, the frontend and the
engine share. Off unless configured; off, every call returns at once (docs/tracing.md). Beside it, the
stack dump on SIGUSR1 every service process installs (stacks.py)."""
from __future__ import annotations

from tracing.propagation import TRACEPARENT, TRACESTATE, carrier_of, context_of, headers_of, pass_through, passed
from tracing.settings import FLAG, TracingSettings, settings_from
from tracing.stacks import dump_stacks_on_usr1
from tracing.tracer import (
    CLIENT,
    INTERNAL,
    SERVER,
    annotate,
    configure,
    configure_with,
    current,
    enabled,
    fail,
    record_span,
    server_span,
    shutdown,
    span,
    start_span,
)

__all__ = ["CLIENT", "FLAG", "INTERNAL", "SERVER", "TRACEPARENT", "TRACESTATE", "TracingSettings", "annotate",
           "carrier_of", "configure", "configure_with", "context_of", "current", "dump_stacks_on_usr1", "enabled",
           "fail", "headers_of", "pass_through", "passed", "record_span", "server_span", "settings_from", "shutdown",
           "span", "start_span"]
