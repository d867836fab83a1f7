"""Typed readers for YAML values that record `key.path: problem` instead of raising.

Used by the config loader in the router process, so that one run reports every problem at once;
`defaults` reads a config dataclass's defaults, so the loader never writes one again.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from services.router.config import rules

T = TypeVar("T")
MISSING: Any = object()  # a required key that is absent: "required" is already reported


@functools.cache
def defaults(cls: type) -> Mapping[str, Any]:
    """Field name -> default of the config dataclass `cls` (fields without one are left out)."""
    found: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            found[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            found[f.name] = f.default_factory()
    return MappingProxyType(found)


def show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(f"{path or '(top level)'}: {message}")

    def check(self, path: str, problem: str | None) -> bool:
        if problem:
            self.add(path, problem)
        return problem is None

    def mapping(self, path: str, raw: object, allowed: Collection[str],
                required: Collection[str] = ()) -> dict[str, Any]:
        """The mapping with its keys checked; {} (and an error) when it is not one."""
        if raw is MISSING:
            return {}
        if not isinstance(raw, dict):
            self.add(path, f"expected mapping, got {show(raw)}")
            return {}
        for key in raw:
            if key not in allowed:
                self.add(_join(path, key), rules.unknown_key(key, tuple(allowed)))
        for key in required:
            if key not in raw:
                self.add(_join(path, key), "required")
        return raw

    def named(self, path: str, raw: object) -> dict[str, Any]:
        """A non-empty mapping from names to anything (pools, entries, weights)."""
        if raw is MISSING:
            return {}
        if not isinstance(raw, dict) or not raw:
            self.add(path, f"expected a non-empty mapping of names, got {show(raw)}")
            return {}
        named = {}
        for key, value in raw.items():
            if isinstance(key, str) and key.strip():
                named[key] = value
            else:
                self.add(path, f"expected names to be non-empty strings, got {show(key)}")
        return named

    def items(self, path: str, raw: object, build: Callable[[Fields, str, Any, int], T],
              *, allow_empty: bool = False) -> list[T]:
        """Each list item built by `build(fields, item_path, item, index)`; None for a broken one."""
        if raw is MISSING:
            return []
        if not isinstance(raw, list) or not (raw or allow_empty):
            wanted = "a list" if allow_empty else "a non-empty list"
            self.add(path, f"expected {wanted}, got {'an empty list' if raw == [] else show(raw)}")
            return []
        return [build(self, f"{path}[{i}]", item, i) for i, item in enumerate(raw)]

    def string(self, path: str, raw: object) -> str | None:
        if raw is MISSING:
            return None
        if isinstance(raw, str) and raw.strip():
            return raw
        self.add(path, f"expected a non-empty string, got {show(raw)}")
        return None

    def strings(self, path: str, raw: object, *, allow_empty: bool = False) -> tuple[str, ...] | None:
        items = self.items(path, raw, lambda f, p, v, i: f.string(p, v), allow_empty=allow_empty)
        strings = tuple(item for item in items if item is not None)
        if not isinstance(raw, list) or len(strings) < len(items) or not (strings or allow_empty):
            return None
        return strings

    def integer(self, path: str, raw: object, low: int | None = None, high: int | None = None) -> int | None:
        if (isinstance(raw, int) and not isinstance(raw, bool) and (low is None or raw >= low)
                and (high is None or raw <= high)):
            return raw
        self.add(path, f"expected integer{_range(low, high, False)}, got {show(raw)}")
        return None

    def number(self, path: str, raw: object, low: float | None = None, high: float | None = None,
               *, open_low: bool = False) -> float | None:
        if (isinstance(raw, (int, float)) and not isinstance(raw, bool)
                and not (isinstance(raw, float) and math.isnan(raw))
                and (low is None or raw > low or (raw == low and not open_low))
                and (high is None or raw <= high)):
            return float(raw)
        self.add(path, f"expected number{_range(low, high, open_low)}, got {show(raw)}")
        return None

    def boolean(self, path: str, raw: object) -> bool | None:
        if isinstance(raw, bool):
            return raw
        self.add(path, f"expected true or false, got {show(raw)}")
        return None

    def choice(self, path: str, raw: object, allowed: tuple[str, ...], what: str,
               plural: str | None = None) -> str | None:
        if raw is None:
            self.add(path, f"required; one of {', '.join(allowed)}")
            return None
        if not isinstance(raw, str):
            self.add(path, f"expected one of {', '.join(allowed)}, got {show(raw)}")
            return None
        return raw if self.check(path, rules.unknown_name(raw, allowed, what, plural)) else None

    def optional(self, path: str, raw: object, parse: Callable[[str, Any], T | None]) -> T | None:
        return None if raw is None else parse(path, raw)

    def env_list(self, path: str, raw: object) -> tuple[str, ...]:
        """Comma-separated values of the environment variable that `raw` names."""
        value = self.env_value(path, raw, splits=True)
        return tuple(v.strip() for v in (value or "").split(",") if v.strip())

    def env_value(self, path: str, raw: object, *, splits: bool = False) -> str | None:
        """`NAME` (must be set) or `{name: NAME, optional: true}` (may be unset or empty)."""
        if isinstance(raw, dict):
            m = self.mapping(path, raw, ("name", "optional"), required=("name",))
            name, optional = self.string(f"{path}.name", m.get("name", MISSING)), m.get("optional", False)
            optional = self.boolean(f"{path}.optional", optional)
        else:
            name, optional = self.string(path, raw), False
        if name is None or optional is None:
            return None
        value = self.env.get(name, "")
        if not (value.replace(",", "") if splits else value).strip():
            if not optional:
                state = "is not set" if name not in self.env else "holds no value"
                self.add(path, f"environment variable {name} {state} "
                               f"(to allow that: {{name: {name}, optional: true}})")
            return None
        return value.strip()


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _range(low: float | None, high: float | None, open_low: bool) -> str:
    if low is not None and high is not None:
        return f" in {low}..{high}"
    if low is not None:
        return f" {'>' if open_low else '>='} {low}"
    return f" <= {high}" if high is not None else ""
