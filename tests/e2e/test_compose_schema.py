"""deploy/compose/*.yaml against the Compose Specification's JSON schema (the copy check-jsonschema
vendors from compose-spec/compose-spec), and what the default file promises."""
from __future__ import annotations

import copy
import importlib.resources
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from protocol.handshake import TOKEN_ENV
from services.engine.config import parse_args as engine_args
from services.frontend.config import parse_args as frontend_args
from services.router.__main__ import build_parser as router_parser

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
FILES = ("compose.yaml", "compose.gpu.yaml", "compose.sim.yaml")


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    text = (importlib.resources.files("check_jsonschema.builtin_schemas") / "vendor" / "compose-spec.json").read_text()
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _doc(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE / name).read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("name", FILES)
def test_file_validates(validator: jsonschema.protocols.Validator, name: str) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(_doc(name))]
    assert errors == []


def test_schema_rejects_what_compose_rejects(validator: jsonschema.protocols.Validator) -> None:
    doc = _doc("compose.yaml")
    bad_condition = copy.deepcopy(doc)
    bad_condition["services"]["frontend"]["depends_on"]["engine-0"]["condition"] = "service_ready"
    unknown_key = copy.deepcopy(doc)
    unknown_key["services"]["router"]["healthcheck"]["every"] = "2s"
    assert not validator.is_valid(bad_condition)
    assert not validator.is_valid(unknown_key)


def test_default_file_is_the_cpu_fleet() -> None:
    services = _doc("compose.yaml")["services"]
    assert set(services) == {"engine-0", "engine-1", "frontend", "router"}
    for name in ("engine-0", "engine-1"):
        engine = services[name]
        assert engine["image"] == "ghcr.io/fleet/fleet-engine-cpu:0.1.0"
        assert engine["command"][:2] == ["engine", "--headless"] and "sim" not in engine["command"]
        assert "model-cache:/cache" in engine["volumes"]
    frontend = services["frontend"]["command"]
    assert frontend[frontend.index("--data-parallel-size") + 1] == "2"
    assert frontend[frontend.index("--data-parallel-size-local") + 1] == "0"
    assert frontend[frontend.index("--engine-addresses") + 1] == "tcp://engine-0:5555,tcp://engine-1:5555"
    router_config = yaml.safe_load((COMPOSE / "router.yaml").read_text())
    assert [r["url"] for r in router_config["pools"]["tiny"]["replicas"]] == ["http://frontend:8000"]


def test_gpu_override_reserves_a_gpu_per_engine() -> None:
    services = _doc("compose.gpu.yaml")["services"]
    for name in ("engine-0", "engine-1"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert services[name]["image"] == "ghcr.io/fleet/fleet-engine-cuda:0.1.0"
        assert devices[0]["capabilities"] == ["gpu"] and len(devices[0]["device_ids"]) == 1
        assert services[name]["volumes"][0].endswith(":/models/model:ro")


def test_each_service_is_given_longer_than_its_own_drain_before_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    """compose's default 10 s would cut the 30 s that SIGTERM gives running work: each service's
    stop_grace_period is longer than the drain its own flags (defaults included) set."""
    monkeypatch.setenv(TOKEN_ENV, "t" * 64)  # as the file's ENGINE_AUTH_TOKEN: the engines listen on 0.0.0.0
    drains = {"engine": lambda argv: engine_args(argv).drain_timeout_s,
              "frontend": lambda argv: frontend_args(argv).shutdown_timeout_s,
              "router": lambda argv: router_parser().parse_args(argv).shutdown_timeout}
    services = _doc("compose.yaml")["services"]
    for name, service in services.items():
        command = service["command"]
        drain = drains[command[0]](command[1:])
        grace = service["stop_grace_period"]
        assert grace.endswith("s") and float(grace[:-1]) > drain, (name, grace, drain)
