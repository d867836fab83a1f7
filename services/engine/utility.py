"""Allowlisted utility calls: names and argument types checked here, never getattr on a name.

Runs in the engine process (the core loop checks every UtilityCall before it acts on it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True, slots=True)
class OneOf:
    """One of these values, of exactly their type (True is not 1)."""

    values: tuple[Any, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Kind

    def describe(self) -> str:
        return f"a list of {describe(self.item)}"


@dataclass(frozen=True, slots=True)
class Record:
    """A dict with exactly these keys (all required)."""

    fields: dict[str, Kind]

    def describe(self) -> str:
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in self.fields.items()) + "}"


@dataclass(frozen=True, slots=True)
class Default:
    """An argument that may be left out; the call then gets `value`."""

    kind: Kind
    value: Any


Kind = Union[type, OneOf, ListOf, Record]

TENSOR = Record({"name": str, "dtype": str, "shape": ListOf(int), "frame": int, "offset": int, "nbytes": int})
PAUSE_MODES = ("keep", "abort", "wait")

# name -> {argument: kind}. The core loop runs pause/resume/is_paused/stats itself; the rest go to the backend.
ALLOWED: dict[str, dict[str, Kind | Default]] = {
    "stats": {},
    "pause": {"mode": Default(OneOf(PAUSE_MODES), "keep")},
    "resume": {},
    "is_paused": {},
    "reset_prefix_cache": {},
    "sleep": {"level": OneOf((1, 2))},
    "wake_up": {},
    "is_sleeping": {},
    "add_lora": {"name": str, "path": str},
    "remove_lora": {"name": str},
    "list_loras": {},
    "start_weight_update": {},
    # The tensors' bytes are the UtilityCall's raw frames (frame 0: the first after the msgpack body).
    "update_weights": {"tensors": ListOf(TENSOR)},
    "finish_weight_update": {"version": str},
    "weight_version": {},
}


class UtilityError(ValueError):
    pass


def describe(kind: Kind) -> str:
    return kind.__name__ if isinstance(kind, type) else kind.describe()


def check(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments with defaults filled in; raises UtilityError naming what is wrong."""
    spec = ALLOWED.get(name)
    if spec is None:
        raise UtilityError(f"unknown utility {name!r}; allowed: {', '.join(sorted(ALLOWED))}")
    unknown = sorted(set(args) - set(spec))
    if unknown:
        raise UtilityError(f"utility {name!r}: unknown argument(s) {unknown}; allowed: {sorted(spec)}")
    out: dict[str, Any] = {}
    for arg, kind in spec.items():
        if arg not in args:
            if isinstance(kind, Default):
                out[arg] = kind.value
                continue
            raise UtilityError(f"utility {name!r}: missing argument {arg!r} ({describe(kind)})")
        value = args[arg]
        problem = _problem(value, kind.kind if isinstance(kind, Default) else kind, arg)
        if problem is not None:
            raise UtilityError(f"utility {name!r}: {problem}")
        out[arg] = value
    return out


def _problem(value: Any, kind: Kind, where: str) -> str | None:
    """What is wrong with `value` at `where` (an argument name, then [i] and .key), or None."""
    if isinstance(kind, type):
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            return f"argument {where!r} must be {kind.__name__}, got {type(value).__name__}"
        return None
    if isinstance(kind, OneOf):
        if not any(type(value) is type(v) and value == v for v in kind.values):
            return f"argument {where!r} must be {kind.describe()}, got {value!r} ({type(value).__name__})"
        return None
    if isinstance(kind, ListOf):
        if not isinstance(value, list):
            return f"argument {where!r} must be {kind.describe()}, got {type(value).__name__}"
        for i, item in enumerate(value):
            problem = _problem(item, kind.item, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if not isinstance(value, dict):
        return f"argument {where!r} must be {kind.describe()}, got {type(value).__name__}"
    keys = set(value)
    if keys != set(kind.fields):
        missing, extra = sorted(set(kind.fields) - keys), sorted(keys - set(kind.fields))
        return (f"argument {where!r} must have exactly the keys {list(kind.fields)}"
                + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
    for key, sub in kind.fields.items():
        problem = _problem(value[key], sub, f"{where}.{key}")
        if problem is not None:
            return problem
    return None
