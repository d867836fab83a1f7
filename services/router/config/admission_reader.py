"""Readers of the admission keys in the router config: `admission:` (priority classes, shared limits), a
listener's `limits`, `user_limits` and `keys` (types and defaults in admission.py). Run once by the
router process at start, from the loader; problems go to `Fields` with their key paths."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.router.config.admission import (
    NO_LIMITS,
    ON_STORE_ERROR,
    AdmissionConfig,
    KeySettings,
    Limits,
    PriorityClass,
)
from services.router.config.fields import MISSING, Fields, defaults

ADMISSION_KEYS = ("priorities", "default_priority", "starvation_s", "shared", "on_store_error")
LIMIT_KEYS = ("requests_per_minute", "tokens_per_minute")
KEY_KEYS = ("key", "key_env", "name", "tenant", "priority", "priority_header", "limits", "user_limits")
CLASS_KEYS = ("name", "queue_ttl_s")


def read_admission(f: Fields, raw: object, has_store: bool) -> AdmissionConfig:
    d = defaults(AdmissionConfig)
    m = f.mapping("admission", raw, ADMISSION_KEYS)
    priorities: tuple[PriorityClass, ...] = d["priorities"]
    if "priorities" in m:
        read = f.items("admission.priorities", m["priorities"], _class)
        names = [c.name for c in read if c is not None]
        for name in {n for n in names if names.count(n) > 1}:
            f.add("admission.priorities", f"duplicate class {name!r}")
        if read and all(c is not None for c in read):
            priorities = tuple(c for c in read if c is not None)
    names = [c.name for c in priorities]
    if "default_priority" in m:
        default = f.choice("admission.default_priority", m["default_priority"], tuple(names), "class", "classes")
    elif "standard" in names:
        default = "standard"
    else:
        f.add("admission.default_priority", f"required when no class is named standard; one of {', '.join(names)}")
        default = None
    starvation = f.number("admission.starvation_s", m.get("starvation_s", d["starvation_s"]), 0, open_low=True)
    shared = f.boolean("admission.shared", m.get("shared", d["shared"]))
    if shared and not has_store:
        f.add("admission.shared", "needs a `store` to count in (postgres, to share limits between routers)")
    on_error = f.choice("admission.on_store_error", m.get("on_store_error", d["on_store_error"]), ON_STORE_ERROR,
                        "value")
    return AdmissionConfig(priorities, default or d["default_priority"], starvation or d["starvation_s"],
                           bool(shared), on_error or d["on_store_error"])


def _class(f: Fields, path: str, raw: object, i: int) -> PriorityClass | None:
    m = f.mapping(path, raw, CLASS_KEYS, required=("name",))
    name = f.string(f"{path}.name", m.get("name", MISSING))
    ttl = f.number(f"{path}.queue_ttl_s", m.get("queue_ttl_s", defaults(PriorityClass)["queue_ttl_s"]), 0,
                   open_low=True)
    if name is None or ttl is None or not m:
        return None
    return PriorityClass(name, ttl)


def read_limits(f: Fields, path: str, raw: object) -> Limits:
    m = f.mapping(path, raw, LIMIT_KEYS)
    rpm = f.optional(f"{path}.requests_per_minute", m.get("requests_per_minute"), lambda p, v: f.integer(p, v, 1))
    tpm = f.optional(f"{path}.tokens_per_minute", m.get("tokens_per_minute"), lambda p, v: f.integer(p, v, 1))
    return Limits(rpm, tpm)


def read_listener_admission(f: Fields, path: str, m: Mapping[str, Any], api_keys: tuple[str, ...],
                            admission: AdmissionConfig) -> tuple[Limits, Limits, dict[str, KeySettings]]:
    """A listener's `limits`, `user_limits` and `keys` (by the key itself)."""
    limits = read_limits(f, f"{path}.limits", m["limits"]) if "limits" in m else NO_LIMITS
    user_limits = read_limits(f, f"{path}.user_limits", m["user_limits"]) if "user_limits" in m else NO_LIMITS
    keys: dict[str, KeySettings] = {}
    if "keys" not in m:
        return limits, user_limits, keys
    if not api_keys:
        f.add(f"{path}.keys", "a listener without api_keys is open: there are no keys to set")
    classes = tuple(c.name for c in admission.priorities)
    names: dict[str, str] = {}

    def one(f: Fields, at: str, raw: object, i: int) -> None:
        k = f.mapping(at, raw, KEY_KEYS)
        if ("key" in k) == ("key_env" in k):
            if k:
                f.add(at, "set exactly one of key, key_env")
            return
        key = f.string(f"{at}.key", k["key"]) if "key" in k else f.env_value(f"{at}.key_env", k["key_env"])
        if key is None:
            return
        where = f"{at}.key" if "key" in k else f"{at}.key_env"
        if key not in api_keys:
            f.add(where, "not one of this listener's api_keys or api_keys_env (the key is not shown)")
        if key in keys:
            f.add(where, "this key's settings are already given (the key is not shown)")
        name = f.optional(f"{at}.name", k.get("name"), f.string)
        if name is not None:
            if name in names:
                f.add(f"{at}.name", f"{name!r} already names {names[name]}")
            names[name] = at
        priority = f.choice(f"{at}.priority", k["priority"], classes, "class", "classes") if "priority" in k else None
        keys[key] = KeySettings(
            name=name,
            tenant=f.optional(f"{at}.tenant", k.get("tenant"), f.string),
            priority=priority,
            priority_header=bool(f.boolean(f"{at}.priority_header", k.get("priority_header", False))),
            limits=read_limits(f, f"{at}.limits", k["limits"]) if "limits" in k else None,
            user_limits=read_limits(f, f"{at}.user_limits", k["user_limits"]) if "user_limits" in k else None)

    f.items(f"{path}.keys", m["keys"], one)
    return limits, user_limits, keys


def read_queue_size(f: Fields, path: str, raw: object) -> int | None:
    return f.integer(path, raw, 0, 1_000_000)
