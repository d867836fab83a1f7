"""deploy/compose's start order and healthcheck reading without containers: levels along depends_on from the
merged model podman-compose prints for the shipped files, the errors that name the field, and a healthcheck
as `podman inspect` reports it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy.compose.health import check_of, status
from deploy.compose.plan import PlanError, plan_of

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "deploy" / "compose"


def _config(*files: str) -> dict[str, object]:
    """The model as `python -m deploy.compose` gets it: podman-compose's merge and interpolation."""
    argv = [sys.executable, "-m", "podman_compose", *(a for f in files for a in ("-f", str(COMPOSE / f))), "config"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ENGINE_AUTH_TOKEN": "t0ken", "ROUTER_PORT": "18080"})
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load(done.stdout)
    assert isinstance(model, dict)
    return model


def test_shipped_files_start_engines_then_frontend_then_router() -> None:
    model = _config("compose.yaml", "compose.sim.yaml")
    plan = plan_of(model)
    assert plan.project == "fleet"
    assert plan.levels() == [["engine-0", "engine-1"], ["frontend"], ["router"]]
    assert plan.services["frontend"].depends_on == {"engine-0": "service_healthy", "engine-1": "service_healthy"}
    assert plan.services["router"].depends_on == {"frontend": "service_healthy"}
    # the sim override runs the engines on the slim image: `make test` needs no engine-cpu image
    assert {s.image for s in plan.services.values()} == {"ghcr.io/fleet/fleet-slim:0.1.0"}
    assert "18080:8080" in model["services"]["router"]["ports"]  # type: ignore[index]


def test_default_file_needs_the_engine_image() -> None:
    plan = plan_of(_config("compose.yaml"))
    assert plan.services["engine-0"].image == "ghcr.io/fleet/fleet-engine-cpu:0.1.0"


def test_levels_follow_the_longest_chain_and_keep_file_order() -> None:
    job = {"depends_on": {"db": {"condition": "service_completed_successfully"}}}
    plan = plan_of({"services": {"web": {"depends_on": ["api", "db"]}, "db": {}, "api": {"depends_on": {"db": None}},
                                 "cache": {}, "job": job}})
    assert plan.levels() == [["db", "cache"], ["api", "job"], ["web"]]
    assert plan.services["web"].depends_on == {"api": "service_started", "db": "service_started"}
    assert plan.services["job"].depends_on == {"db": "service_completed_successfully"}


@pytest.mark.parametrize(("services", "message"), [
    ({"a": {"depends_on": ["b"]}, "b": {"depends_on": ["a"]}}, "depends_on has a cycle: a -> b -> a"),
    ({"a": {"depends_on": ["nope"]}}, "services.a.depends_on: 'nope' is not a service of this project"),
    ({"a": {"depends_on": {"a2": {"condition": "service_ready"}}}, "a2": {}},
     "services.a.depends_on.a2.condition: 'service_ready' is not one of service_started, service_healthy"),
    ({}, "services: the compose model has none"),
])
def test_a_plan_that_cannot_start_is_refused_naming_the_field(services: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        plan_of({"services": services}).levels()


def test_healthcheck_as_podman_inspect_reports_it() -> None:
    record = {"Config": {"Healthcheck": {"Test": ["CMD", "python", "-m", "services.engine.probe"],
                                         "Interval": 2_000_000_000, "Timeout": 3_000_000_000,
                                         "StartPeriod": 180_000_000_000, "Retries": 3}},
              "State": {"Healthcheck": {"Status": "starting"}}}
    check = check_of("fleet_engine-0_1", record)
    assert check is not None
    assert (check.interval_s, check.timeout_s, check.start_period_s, check.retries) == (2, 3, 180, 3)
    assert check.budget_s == 180 + 3 * (2 + 3)
    assert status(record) == "starting"
    assert check_of("x", {"Config": {"Healthcheck": {"Test": ["NONE"]}}}) is None
    assert check_of("x", {"Config": {}}) is None
    defaults = check_of("x", {"Config": {"Healthcheck": {"Test": ["CMD-SHELL", "true"]}}})
    assert defaults is not None and (defaults.interval_s, defaults.retries) == (30, 3)
