"""The process's tracer (router, frontend or engine process): configured once at start from its settings,
shut down (spans flushed) at exit, and the few calls the services make to open spans. Off (the default)
the module's tracer is None: every call is one check of it and returns at once, no span object made."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode, Tracer

from tracing.propagation import carrier_of, context_of
from tracing.settings import TracingSettings, settings_from

Attributes = Mapping[str, Any]
SERVER, CLIENT, INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_OFF: AbstractContextManager[None] = contextlib.nullcontext()


def configure(service_name: str, flag_endpoint: str | None = None, environ: Mapping[str, str] | None = None, *,
              global_provider: bool = False) -> TracingSettings | None:
    """Tracing for this process from the OTEL_* environment and the service's --otlp-traces-endpoint
    (settings.py), or left off. `global_provider`: also OpenTelemetry's global provider, so that a
    library's own spans (vLLM's) export with ours. ValueError naming the variable for a bad setting."""
    settings = settings_from(service_name, os.environ if environ is None else environ, flag_endpoint)
    configure_with(settings, global_provider=global_provider)
    return settings


def configure_with(settings: TracingSettings | None, exporter: SpanExporter | None = None, *,
                   global_provider: bool = False) -> None:
    """As configure(), from settings already read; `exporter` in place of the settings' (tests)."""
    global _tracer, _provider
    shutdown()
    if settings is None:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}),
                              sampler=_sampler(settings))
    provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(settings)))
    if global_provider:
        trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("fleet")


def shutdown() -> None:
    """Every finished span exported (BatchSpanProcessor flushed), then off: at process exit."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _tracer is not None


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[Span | None]:
    """A child of the current span, current inside the `with` (None when off)."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes)


def server_span(name: str, headers: Any, attributes: Attributes | None = None) -> AbstractContextManager[Span | None]:
    """A request's span in a server, continuing the trace its W3C headers name (ASGI byte pairs or gRPC
    metadata), a new trace without them; current inside the `with` (None when off)."""
    if _tracer is None:
        return _OFF
    # The status is the server's to set: a refusal it answers (a 4xx) is not an error of its own.
    return _tracer.start_as_current_span(name, context=context_of(carrier_of(headers)), kind=SERVER,
                                         attributes=attributes, set_status_on_exception=False)


def start_span(name: str, *, parent: Span | Mapping[str, str] | None = None, kind: SpanKind = INTERNAL,
               start_ns: int | None = None, attributes: Attributes | None = None) -> Span | None:
    """A span the caller ends itself (it outlives a `with`), child of `parent` (a span, W3C headers from
    another process, or None: the current span). None when off."""
    if _tracer is None:
        return None
    context: Context | None
    if isinstance(parent, Span):
        context = trace.set_span_in_context(parent)
    elif parent is not None:
        context = context_of(parent)
    else:
        context = None
    return _tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_ns)


def record_span(parent: Span, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
    """A finished child of `parent` over a time already past (a phase known from timestamps)."""
    if _tracer is None:
        return
    child = _tracer.start_span(name, context=trace.set_span_in_context(parent), attributes=attributes,
                               start_time=start_ns)
    child.end(end_time=max(start_ns, end_ns))


def annotate(span: Span | None, attributes: Attributes) -> None:
    if span is not None:
        span.set_attributes(attributes)


def fail(span: Span | None, description: str) -> None:
    """The span's status: error, with why."""
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, description))


def current() -> Span | None:
    """The current span, None when off or outside every span."""
    if _tracer is None:
        return None
    now = trace.get_current_span()
    return None if isinstance(now, NonRecordingSpan) and not now.get_span_context().is_valid else now


def _sampler(settings: TracingSettings) -> Sampler:
    name = settings.sampler
    root: Sampler = (ALWAYS_OFF if name.endswith("always_off") else
                     TraceIdRatioBased(settings.sampler_arg) if name.endswith("traceidratio") else ALWAYS_ON)
    return ParentBased(root) if name.startswith("parentbased_") else root


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    headers = dict(settings.headers) or None
    if settings.protocol == "grpc":
        # Imported only here: grpcio is heavy, and http/protobuf needs none of it.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=settings.endpoint, headers=headers,
                            insecure=not settings.endpoint.startswith("https://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=settings.endpoint, headers=headers)
