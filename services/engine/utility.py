"""Allowlisted utility calls: names and argument types checked here, never getattr on a name."""
from __future__ import annotations

from typing import Any

# name -> {argument: type}. The core loop runs pause/resume/stats itself; the rest go to the backend.
ALLOWED: dict[str, dict[str, type]] = {
    "stats": {},
    "pause": {},
    "resume": {},
    "reset_prefix_cache": {},
    "sleep": {"level": int},
    "wake_up": {},
    "add_lora": {"name": str, "path": str},
    "remove_lora": {"name": str},
    "list_loras": {},
}


class UtilityError(ValueError):
    pass


def check(name: str, args: dict[str, Any]) -> None:
    """Raise UtilityError naming what is wrong with this call."""
    spec = ALLOWED.get(name)
    if spec is None:
        raise UtilityError(f"unknown utility {name!r}; allowed: {', '.join(sorted(ALLOWED))}")
    unknown = sorted(set(args) - set(spec))
    if unknown:
        raise UtilityError(f"utility {name!r}: unknown argument(s) {unknown}; allowed: {sorted(spec)}")
    for arg, kind in spec.items():
        if arg not in args:
            raise UtilityError(f"utility {name!r}: missing argument {arg!r} ({kind.__name__})")
        value = args[arg]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise UtilityError(
                f"utility {name!r}: argument {arg!r} must be {kind.__name__}, got {type(value).__name__}"
            )
