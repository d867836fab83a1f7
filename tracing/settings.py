"""Tracing settings read the standard OpenTelemetry way (the OTEL_* environment) and from a service's
`--otlp-traces-endpoint` flag (vLLM's name), by every process that traces: router, frontend, engine.
Pure: what is configured, checked, with errors that name the variable or flag and the allowed values."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

FLAG = "--otlp-traces-endpoint"
PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console", "none")
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
# The OTel spec's defaults when an exporter is asked for with no endpoint.
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Where and how a process exports its spans. exporter: "otlp" or "console" (stderr, for a look).
    endpoint: the traces URL for http/protobuf (ending /v1/traces), host:port or a URL for grpc."""

    service_name: str
    exporter: str = "otlp"
    endpoint: str = DEFAULT_HTTP_ENDPOINT + TRACES_PATH
    protocol: str = "http/protobuf"
    headers: tuple[tuple[str, str], ...] = ()
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0


def settings_from(service_name: str, environ: Mapping[str, str], flag_endpoint: str | None = None
                  ) -> TracingSettings | None:
    """The process's tracing settings, or None: tracing off. Off unless configured: an endpoint (the
    flag, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) or OTEL_TRACES_EXPORTER
    set to otlp or console; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off whatever
    else says. The flag wins over the environment's endpoint. Protocol: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc for the flag (vLLM's default for it) and http/protobuf
    for the environment (the spec's). ValueError naming the variable and the allowed values."""
    if _get(environ, "OTEL_SDK_DISABLED").lower() == "true":
        return None
    exporter = _get(environ, "OTEL_TRACES_EXPORTER").lower()
    if exporter and exporter not in EXPORTERS:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r} is not supported; allowed: {', '.join(EXPORTERS)}")
    if exporter == "none":
        return None
    if flag_endpoint is not None and not flag_endpoint.strip():
        raise ValueError(f"{FLAG}: empty; give the collector's URL (http://host:4317 for grpc, "
                         "http://host:4318/v1/traces for http/protobuf)")
    traces_endpoint = _get(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base_endpoint = _get(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (flag_endpoint or traces_endpoint or base_endpoint or exporter):
        return None
    name = _get(environ, "OTEL_SERVICE_NAME") or service_name
    if exporter == "console":
        sampler, ratio = _sampler(environ)
        return TracingSettings(name, "console", "", sampler=sampler, sampler_arg=ratio)
    protocol_var = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if _get(environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    else "OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = _get(environ, protocol_var) or ("grpc" if flag_endpoint else "http/protobuf")
    if protocol not in PROTOCOLS:
        raise ValueError(f"{protocol_var}={protocol!r} is not supported; allowed: {', '.join(PROTOCOLS)}")
    if flag_endpoint:
        endpoint = flag_endpoint.strip()
    elif traces_endpoint:
        endpoint = traces_endpoint  # the signal's own variable is used as given (the spec)
    elif base_endpoint:
        # The base endpoint gets the signal's path appended for http/protobuf (the spec); grpc has no path.
        endpoint = base_endpoint.rstrip("/") + TRACES_PATH if protocol == "http/protobuf" else base_endpoint
    else:
        endpoint = DEFAULT_HTTP_ENDPOINT + TRACES_PATH if protocol == "http/protobuf" else DEFAULT_GRPC_ENDPOINT
    headers_var = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS" if _get(environ, "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                   else "OTEL_EXPORTER_OTLP_HEADERS")
    sampler, ratio = _sampler(environ)
    return TracingSettings(name, "otlp", endpoint, protocol, _headers(headers_var, _get(environ, headers_var)),
                           sampler, ratio)


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _headers(var: str, text: str) -> tuple[tuple[str, str], ...]:
    """The spec's `key1=value1,key2=value2`, values URL-encoded."""
    pairs = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{var}: {item.strip()!r} is not key=value; expected key1=value1,key2=value2")
        pairs.append((unquote(key.strip()).lower(), unquote(value.strip())))
    return tuple(pairs)


def _sampler(environ: Mapping[str, str]) -> tuple[str, float]:
    name = _get(environ, "OTEL_TRACES_SAMPLER").lower() or "parentbased_always_on"
    if name not in SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r} is not supported; allowed: {', '.join(SAMPLERS)}")
    text = _get(environ, "OTEL_TRACES_SAMPLER_ARG")
    if not text or not name.endswith("traceidratio"):
        return name, 1.0
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r}: expected a ratio in [0, 1] for {name}")
    return name, ratio
