"""The reader of decision-model deployments in the router config (`deployments:`; types in types.py).

Run once by the router process at start, from the loader; each deployment is one model served by
managed workers (the router starts our engine + frontend per replica) or attached ones (URLs of any
server speaking vLLM's pooling API, or the System One API). Every field is documented in
docs/router-config.md.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from services.router.config import rules
from services.router.config.budget import ATTACHED_APIS
from services.router.config.fields import MISSING, Fields, defaults
from services.router.config.types import (
    BACKENDS,
    TASKS,
    AttachedConfig,
    DeploymentConfig,
    ManagedConfig,
)

DEPLOYMENT_KEYS = ("model", "revision", "tasks", "managed", "attached", "max_inflight", "timeout_s",
                   "start_timeout_s", "health", "breaker", "labels")
# A managed worker is our frontend: its /ready fails until an engine rank serves, /health does not.
MANAGED_HEALTH_PATH = "/ready"

Reader = Callable[[Fields, str, object], Any]


def read_deployments(f: Fields, raw: object, *, health: Reader, breaker: Reader) -> dict[str, DeploymentConfig]:
    """`deployments:` (a mapping name -> deployment); problems go to `f` with their key paths. `health`
    and `breaker` are the pools' readers of those sections (the loader's), shared rather than copied."""
    if raw is MISSING or raw == {}:  # none declared, or every one commented out
        return {}
    built = {}
    for name, item in f.named("deployments", raw).items():
        deployment = _deployment(f, f"deployments.{name}", name, item, health, breaker)
        if deployment is not None:
            built[name] = deployment
    return built


def _deployment(f: Fields, path: str, name: str, raw: object, health: Reader,
                breaker: Reader) -> DeploymentConfig | None:
    m = f.mapping(path, raw, DEPLOYMENT_KEYS, required=("model", "tasks"))
    if not m:
        return None
    if ("managed" in m) == ("attached" in m):
        f.add(path, "set exactly one of managed, attached")
    d = defaults(DeploymentConfig)
    model = f.string(f"{path}.model", m.get("model", MISSING))
    revision = f.optional(f"{path}.revision", m.get("revision"), f.string)
    tasks = f.strings(f"{path}.tasks", m.get("tasks", MISSING))
    for i, task in enumerate(tasks or ()):
        f.check(f"{path}.tasks[{i}]", rules.unknown_name(task, TASKS, "task"))
    if tasks is not None and {"embed", "classify"} <= set(tasks):
        f.add(f"{path}.tasks", "embed and classify need two deployments: a model has one pooling task, an "
                               "embedding model's or a classifier's (score and rerank go with either)")
    managed = _managed(f, f"{path}.managed", m["managed"]) if "managed" in m else None
    attached = _attached(f, f"{path}.attached", m["attached"]) if "attached" in m else None
    inflight = f.integer(f"{path}.max_inflight", m.get("max_inflight", d["max_inflight"]), 1)
    timeout = f.number(f"{path}.timeout_s", m.get("timeout_s", d["timeout_s"]), 0, open_low=True)
    start = f.number(f"{path}.start_timeout_s", m.get("start_timeout_s", d["start_timeout_s"]), 0, open_low=True)
    raw_health = m.get("health", {})
    if managed is not None and isinstance(raw_health, dict) and "path" not in raw_health:
        raw_health = {**raw_health, "path": MANAGED_HEALTH_PATH}
    checks = health(f, f"{path}.health", raw_health)
    breaks = breaker(f, f"{path}.breaker", m.get("breaker", {}))
    labels = f.strings(f"{path}.labels", m["labels"]) if "labels" in m else ()
    if labels and tasks is not None and "classify" not in tasks:
        f.add(f"{path}.labels", "only for a deployment with task classify (the names of its classes)")
    parts = (model, tasks, inflight, timeout, start, labels)
    if any(p is None for p in parts) or (managed is None) == (attached is None):
        return None
    if tasks is None or any(t not in TASKS for t in tasks):
        return None
    assert model is not None and inflight is not None and timeout is not None and start is not None
    return DeploymentConfig(name, model, tuple(dict.fromkeys(tasks)), revision, managed, attached, inflight,
                            timeout, start, checks, breaks, labels or ())


def _managed(f: Fields, path: str, raw: object) -> ManagedConfig | None:
    m = f.mapping(path, raw, ("replicas", "backend", "engine_args", "frontend_args"))
    d = defaults(ManagedConfig)
    replicas = f.integer(f"{path}.replicas", m.get("replicas", d["replicas"]), 1, 64)
    backend = f.choice(f"{path}.backend", m.get("backend", d["backend"]), BACKENDS, "backend")
    engine_args = f.strings(f"{path}.engine_args", m.get("engine_args", []), allow_empty=True)
    frontend_args = f.strings(f"{path}.frontend_args", m.get("frontend_args", []), allow_empty=True)
    # The runtime sets these itself (ports, addresses, the runner): a second value would fight it.
    for key, args, owned in (("engine_args", engine_args, _ENGINE_OWNED), ("frontend_args", frontend_args,
                                                                           _FRONTEND_OWNED)):
        for i, arg in enumerate(args or ()):
            flag = arg.split("=", 1)[0]
            # argparse would read a prefix (--mod) as the flag it abbreviates: refused the same (the
            # workers' parsers refuse abbreviations too, allow_abbrev=False).
            if flag in owned or (flag.startswith("--") and len(flag) > 2 and any(o.startswith(flag) for o in owned)):
                f.add(f"{path}.{key}[{i}]", f"{flag} is set by the router for its managed workers "
                                            f"(it sets {', '.join(owned)})")
    if not isinstance(raw, dict) or None in (replicas, backend, engine_args, frontend_args):
        return None
    assert replicas is not None and backend is not None and engine_args is not None and frontend_args is not None
    return ManagedConfig(replicas, backend, engine_args, frontend_args)


_ENGINE_OWNED = ("--model", "--backend", "--host", "--port", "--runner", "--data-parallel-size-local",
                 "--headless", "--auth-token", "--auth-token-file")
_FRONTEND_OWNED = ("--model", "--host", "--port", "--served-model-name", "--data-parallel-size",
                   "--data-parallel-size-local", "--engine-addresses", "--api-key", "--auth-token",
                   "--auth-token-file")


def _attached(f: Fields, path: str, raw: object) -> AttachedConfig | None:
    m = f.mapping(path, raw, ("urls", "api_key", "api_key_env", "api"), required=("urls",))
    api = f.choice(f"{path}.api", m.get("api", defaults(AttachedConfig)["api"]), ATTACHED_APIS, "api")
    urls = f.strings(f"{path}.urls", m.get("urls", MISSING))
    ok = urls is not None
    for i, url in enumerate(urls or ()):
        ok = f.check(f"{path}.urls[{i}]", rules.url_problem(url)) and ok
        if ok and urlsplit(url).username is not None:  # it would be logged and shown by /ready
            ok = f.check(f"{path}.urls[{i}]", "credentials in a URL are not allowed (the URL is logged and "
                         "shown); set api_key or api_key_env") and ok
    cleaned = [u.rstrip("/") for u in urls or ()]
    for i in rules.duplicates(cleaned):
        f.add(f"{path}.urls[{i}]", f"duplicate url {cleaned[i]!r}")
        ok = False
    if "api_key" in m and "api_key_env" in m:
        f.add(path, "set at most one of api_key, api_key_env")
    api_key = f.optional(f"{path}.api_key", m.get("api_key"), f.string)
    if "api_key_env" in m:
        api_key = f.env_value(f"{path}.api_key_env", m["api_key_env"])
    return AttachedConfig(tuple(cleaned), api_key, api) if ok and m and api else None
