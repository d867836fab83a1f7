"""tracing/settings.py: what the OTEL_* environment and --otlp-traces-endpoint turn on, and the errors."""
from __future__ import annotations

import pytest

from tracing.settings import TracingSettings, settings_from


def test_off_unless_configured() -> None:
    assert settings_from("router", {}) is None
    assert settings_from("router", {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None


def test_the_flag_turns_it_on_over_grpc_as_vllms_flag_does() -> None:
    got = settings_from("engine", {}, "http://collector:4317")
    assert got == TracingSettings("engine", "otlp", "http://collector:4317", "grpc")


def test_the_flag_wins_over_the_environments_endpoint_and_keeps_its_protocol() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:4318/v1/traces",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    got = settings_from("frontend", env, "http://b:4318/v1/traces")
    assert got is not None and (got.endpoint, got.protocol) == ("http://b:4318/v1/traces", "http/protobuf")


def test_the_base_endpoint_gets_the_traces_path_for_http_only() -> None:
    got = settings_from("router", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
    assert got is not None and (got.endpoint, got.protocol) == ("http://c:4318/v1/traces", "http/protobuf")
    got = settings_from("router", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                                   "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert got is not None and got.endpoint == "http://c:4317"


def test_the_signals_own_variables_win_over_the_general_ones() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Api-Key=s%20ecret, b = 2"}
    got = settings_from("router", env)
    assert got is not None
    assert (got.endpoint, got.protocol, got.headers) == ("http://t/x", "http/protobuf",
                                                         (("api-key", "s ecret"), ("b", "2")))


def test_exporter_alone_turns_it_on_at_the_specs_default_endpoint() -> None:
    got = settings_from("router", {"OTEL_TRACES_EXPORTER": "otlp"})
    assert got is not None and got.endpoint == "http://localhost:4318/v1/traces"
    got = settings_from("router", {"OTEL_TRACES_EXPORTER": "console"})
    assert got is not None and got.exporter == "console"


@pytest.mark.parametrize("env", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_disabled_wins_over_every_endpoint(env: dict[str, str]) -> None:
    assert settings_from("router", {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://d:4317") is None


def test_service_name_and_sampler() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SERVICE_NAME": "router-eu",
           "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    got = settings_from("router", env)
    assert got is not None and (got.service_name, got.sampler, got.sampler_arg) == (
        "router-eu", "parentbased_traceidratio", 0.25)


@pytest.mark.parametrize(("env", "flag", "named"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, None, "OTEL_TRACES_EXPORTER='zipkin' is not supported; allowed: otlp"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "http://c", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL='thrift' is not supported; "
                                                            "allowed: http/protobuf, grpc"),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "http://c", "OTEL_TRACES_SAMPLER='sometimes' is not supported"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "http://c",
     "OTEL_TRACES_SAMPLER_ARG='2': expected a ratio in [0, 1]"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "http://c", "OTEL_EXPORTER_OTLP_HEADERS: 'novalue' is not key=value"),
    ({}, " ", "--otlp-traces-endpoint: empty"),
])
def test_bad_settings_name_the_variable_and_the_allowed_values(env: dict[str, str], flag: str | None,
                                                               named: str) -> None:
    with pytest.raises(ValueError, match="^" + named.replace("[", r"\[").replace("(", r"\(")):
        settings_from("router", env, flag)
