"""The start order of a compose project: its services in levels along `depends_on`, and the condition each
dependency must meet first, read from the merged model `podman-compose config` prints. Used by
`python -m deploy.compose up`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The Compose Specification's conditions (a bare list of names means service_started).
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


class PlanError(ValueError):
    """The compose model cannot be started in order: an unknown dependency, condition or a cycle."""


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    image: str | None
    built: bool  # has a `build` section: podman-compose builds its image, we need not find it
    depends_on: dict[str, str]  # dependency -> condition


@dataclass(frozen=True, slots=True)
class Plan:
    project: str | None  # the model's `name:`, if it has one
    services: dict[str, Service]

    def levels(self) -> list[list[str]]:
        """Services grouped so that each depends only on services of earlier groups, in file order within
        a group: each group starts together once its dependencies' conditions hold."""
        level: dict[str, int] = {}

        def depth(name: str, path: tuple[str, ...]) -> int:
            if name in path:
                raise PlanError(f"depends_on has a cycle: {' -> '.join((*path[path.index(name):], name))}")
            if name not in level:
                deps = self.services[name].depends_on
                level[name] = 1 + max((depth(d, (*path, name)) for d in deps), default=-1)
            return level[name]

        for name in self.services:
            depth(name, ())
        groups: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
        for name in self.services:
            groups[level[name]].append(name)
        return groups


def plan_of(model: dict[str, Any]) -> Plan:
    """The plan of a merged, interpolated compose model (a mapping as `podman-compose config` prints it)."""
    raw = model.get("services")
    if not isinstance(raw, dict) or not raw:
        raise PlanError("services: the compose model has none (a mapping of service name to service)")
    services = {name: Service(name, spec.get("image"), "build" in spec, _depends_on(name, spec.get("depends_on")))
                for name, spec in raw.items()}
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services:
                raise PlanError(f"services.{service.name}.depends_on: {dep!r} is not a service of this project "
                                f"(services: {', '.join(services)})")
    name = model.get("name")
    return Plan(name if isinstance(name, str) else None, services)


def _depends_on(service: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        return {str(dep): "service_started" for dep in value}
    if not isinstance(value, dict):
        raise PlanError(f"services.{service}.depends_on: a list of service names or a mapping, not {value!r}")
    deps = {}
    for dep, spec in value.items():
        condition = (spec or {}).get("condition", "service_started")
        if condition not in CONDITIONS:
            raise PlanError(f"services.{service}.depends_on.{dep}.condition: {condition!r} is not one of "
                            f"{', '.join(CONDITIONS)}")
        deps[str(dep)] = condition
    return deps
