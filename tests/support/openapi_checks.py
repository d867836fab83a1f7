"""Requests derived from an OpenAPI document's request-body schemas, to hold a service's document to its
parser: for every documented field, a value of a type the schema does not allow (which the service
must refuse with a 400 naming the field), and each documented enum value and range end (which it must
not refuse for that field)."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SAMPLES: dict[str, Any] = {"string": "x", "object": {"x": 1}, "array": [], "boolean": True, "integer": 7,
                           "number": 1.5, "null": None}


@dataclass(frozen=True)
class Probe:
    field: str  # as the 400's param names it: messages[0].role
    body: dict[str, Any]


def resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def branches(schema: dict[str, Any], doc: dict[str, Any]) -> list[dict[str, Any]]:
    schema = resolve(schema, doc)
    if "anyOf" in schema:
        return [b for branch in schema["anyOf"] for b in branches(branch, doc)]
    return [schema]


def json_types(schema: dict[str, Any], doc: dict[str, Any]) -> set[str]:
    """The JSON types a schema allows (an integer is a number too; no type means any)."""
    out: set[str] = set()
    for branch in branches(schema, doc):
        kind = branch.get("type")
        if kind is None and "enum" in branch:
            kind = sorted({_type_of(v) for v in branch["enum"]})
        kinds = set(SAMPLES) if kind is None else {kind} if isinstance(kind, str) else set(kind)
        if "number" in kinds:
            kinds.add("integer")
        out |= kinds
    return out


def _type_of(value: Any) -> str:
    return next(k for k, v in SAMPLES.items() if type(v) is type(value))


def wrong_value(schema: dict[str, Any], doc: dict[str, Any]) -> Any:
    allowed = json_types(schema, doc)
    return next(copy.deepcopy(v) for k, v in SAMPLES.items() if k not in allowed)


def wrong_types(body_schema: dict[str, Any], doc: dict[str, Any], base: dict[str, Any],
                bases: dict[str, dict[str, Any]], where: str = "") -> Iterator[Probe]:
    """For each property (and each property of an object that an array or an object field holds, with
    `bases[component]` as its valid value), `base` with that field of a wrong type."""
    for name, schema in resolve(body_schema, doc).get("properties", {}).items():
        field = f"{where}.{name}" if where else name
        yield Probe(field, {**base, name: wrong_value(schema, doc)})
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") == "array":
                for component in _components(branch.get("items", {}), bases):
                    for probe in wrong_types(_ref(component), doc, bases[component], bases, f"{field}[0]"):
                        yield Probe(probe.field, {**base, name: [probe.body]})
            else:
                for component in _components(branch, bases):
                    for probe in wrong_types(_ref(component), doc, bases[component], bases, field):
                        yield Probe(probe.field, {**base, name: probe.body})


def _ref(component: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{component}"}


def _components(schema: dict[str, Any], bases: dict[str, dict[str, Any]]) -> list[str]:
    """The components `schema` names (itself or its anyOf) that have a valid value in `bases`."""
    refs = [s["$ref"].rsplit("/", 1)[1] for s in schema.get("anyOf", [schema]) if "$ref" in s]
    return [ref for ref in refs if ref in bases]


def documented_values(body_schema: dict[str, Any], doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each top-level property's enum values and range ends, as (field, value)."""
    for name, schema in resolve(body_schema, doc).get("properties", {}).items():
        for branch in branches(schema, doc):
            for value in branch.get("enum", ()):
                yield name, value
            for key in ("minimum", "maximum"):
                if key in branch:
                    yield name, branch[key]
