"""Run a compose file without containers: each service's command as a local process on 127.0.0.1.

    python deploy/compose/run.py deploy/compose/compose.yaml [override.yaml ...] [--ports-file F]

What it does with the compose keys the fleet uses (`image`, `build`, `deploy`, `restart` and
`stop_grace_period` mean nothing to a local process and are skipped; any other key is reported once):
- files are merged as `docker compose -f a -f b` does: mappings key by key, `command`, `entrypoint`
  and `healthcheck.test` replaced, `environment` merged by name, `volumes` by target, `ports`/`expose`
  joined; `${VAR}`, `${VAR:-default}` and `${VAR:?message}` are interpolated from the environment;
- `command` is the image's console script (`engine`, `frontend`, `router`): it becomes
  `python -m services.<name>` with this interpreter, and `python` becomes this interpreter;
- every (service, port) in `expose`/`ports` gets a free loopback port: `<service>:<port>` anywhere in
  any service's args, environment, healthcheck and mounted files becomes `127.0.0.1:<local>`, and in
  the service's own args `--port <port>`, `localhost:<port>` and `0.0.0.0` are rewritten to match;
- named volumes become directories under --volumes-dir; bind-mounted files are copied with the same
  rewrites; a container path in args or environment becomes the local path;
- `depends_on` conditions `service_started` and `service_healthy` (the healthcheck `test` run as a
  local command every `interval` until it passes or `start_period` + `retries` are spent);
- each service's output is printed prefixed with its name; SIGINT/SIGTERM, or a service that exits,
  stop everything: SIGTERM to each process group in reverse start order, SIGKILL after the grace period.
`restart` policies are not applied: a service that exits ends the run, which is what a test wants.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONSOLE_SCRIPTS = {"engine": "services.engine", "frontend": "services.frontend", "router": "services.router"}
REPLACED_KEYS = {"command", "entrypoint"}
APPLIED = {"command", "entrypoint", "environment", "volumes", "expose", "ports", "healthcheck", "depends_on"}
CONTAINER_ONLY = {"image", "build", "deploy", "restart", "stop_grace_period"}


# --- loading and merging -------------------------------------------------------------------------

def load(files: Iterable[Path], env: dict[str, str]) -> dict[str, Any]:
    """The merged, interpolated compose model of `files`, in order."""
    merged: dict[str, Any] = {}
    for path in files:
        doc = yaml.safe_load(path.read_text()) or {}
        doc = _interpolate(doc, env)
        _normalise(doc, path.parent.resolve())
        merged = _merge(merged, doc)
    return merged


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg") or ""
        got = env.get(name)
        if op == ":-" and not got or op == "-" and got is None:
            return arg
        if op == ":?" and not got or op == "?" and got is None:
            raise SystemExit(f"compose: ${{{name}}}: {arg or 'required'}")
        return got or ""

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:-|-|:\?|\?)(?P<arg>[^}]*))?\}", sub, value)


def _normalise(doc: dict[str, Any], base: Path) -> None:
    """List forms to mapping forms, relative bind sources to absolute paths (compose resolves them
    against the file that names them)."""
    for name, svc in (doc.get("services") or {}).items():
        env = svc.get("environment")
        if isinstance(env, list):
            svc["environment"] = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
        deps = svc.get("depends_on")
        if isinstance(deps, list):
            svc["depends_on"] = {d: {"condition": "service_started"} for d in deps}
        for key in ("command", "entrypoint"):
            if isinstance(svc.get(key), str):
                svc[key] = shlex.split(svc[key])
        vols = {}
        for i, v in enumerate(svc.get("volumes") or []):
            source, target, *_ = (v.split(":") + [""])[:3] if isinstance(v, str) else (v.get("source", ""), v["target"])
            if not target or not source:  # an anonymous volume: a fresh directory of its own
                source, target = f"{name}-anonymous-{i}", target or source
            if source.startswith((".", "/")):
                source = str((base / source).resolve())
            vols[target] = source
        if "volumes" in svc:
            svc["volumes"] = vols


def _merge(base: Any, over: Any, key: str = "") -> Any:
    if key in REPLACED_KEYS or key == "test":
        return over
    if key in ("ports", "expose") and isinstance(base, list):
        return base + [p for p in over if p not in base]
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v, k) if k in base else v
        return out
    return over


# --- mapping onto this machine -------------------------------------------------------------------

@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    health: list[str] | None  # argv, or None: no healthcheck
    interval_s: float = 5.0
    timeout_s: float = 30.0
    deadline_s: float = 120.0
    depends_on: dict[str, str] = field(default_factory=dict)  # name -> condition
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port


def plan(model: dict[str, Any], volumes_dir: Path, files_dir: Path) -> list[Service]:
    """The services as local processes, in start order (dependencies first)."""
    specs: dict[str, dict[str, Any]] = model.get("services") or {}
    ports = {name: {p: _free_port() for p in _container_ports(spec)} for name, spec in specs.items()}
    host_map = {f"{name}:{p}": f"127.0.0.1:{local}" for name, m in ports.items() for p, local in m.items()}
    services = []
    for name, spec in specs.items():
        for key in sorted(set(spec) - APPLIED - CONTAINER_ONLY):
            print(f"run | services.{name}.{key}: not supported by the local runner, ignored", flush=True)
        own = {f"{h}:{p}": f"127.0.0.1:{local}" for p, local in ports[name].items() for h in ("localhost", "127.0.0.1")}
        paths: dict[str, str] = {}
        for target, source in (spec.get("volumes") or {}).items():
            if source.startswith("/") and Path(source).is_dir():
                paths[target] = source
            elif source.startswith("/"):
                src = Path(source)
                copy = files_dir / name / src.name
                copy.parent.mkdir(parents=True, exist_ok=True)
                text = _rewrite(src.read_text(), host_map, own)
                copy.write_text(_rewrite_listen_ports(text, ports[name]) if src.suffix in (".yaml", ".yml") else text)
                paths[target] = str(copy)
            else:
                (volumes_dir / source).mkdir(parents=True, exist_ok=True)
                paths[target] = str(volumes_dir / source)
        local = _localiser({**host_map, **own}, paths)
        argv = [local(a) for a in _map_argv((spec.get("entrypoint") or []) + (spec.get("command") or []))]
        argv = _rewrite_port_flags(argv, ports[name])
        env = {k: local(str(v)) for k, v in (spec.get("environment") or {}).items() if v is not None}
        check = spec.get("healthcheck") or {}
        health = _health_argv(check.get("test"), local)
        if health is not None:  # it runs in the service's own container: its --port flags are the service's
            health = _rewrite_port_flags(health, ports[name])
        interval = _duration(check.get("interval", "5s"))
        deadline = _duration(check.get("start_period", "0s")) + interval * (int(check.get("retries", 3)) + 1)
        deps = {d: c.get("condition", "service_started") for d, c in (spec.get("depends_on") or {}).items()}
        for d, c in deps.items():
            if c not in ("service_started", "service_healthy"):
                raise SystemExit(f"compose: services.{name}.depends_on.{d}.condition={c!r}: the runner supports "
                                 "service_started and service_healthy")
        timeout = _duration(check.get("timeout", "30s"))
        services.append(Service(name, argv, env, health, interval, timeout, deadline, deps, ports[name]))
    return _start_order(services)


def _localiser(hosts: dict[str, str], paths: dict[str, str]) -> Callable[[str], str]:
    """One service's view of a string: host:port references, container paths and 0.0.0.0 mapped."""
    def local(s: str) -> str:
        s = _rewrite(s, hosts, {})
        for target, path in paths.items():
            if s == target or s.startswith(target + "/"):
                s = path + s[len(target):]
        return s.replace("0.0.0.0", "127.0.0.1")

    return local


def _container_ports(spec: dict[str, Any]) -> list[int]:
    found = [int(str(p).split("/")[0]) for p in spec.get("expose") or []]
    for p in spec.get("ports") or []:
        target = p["target"] if isinstance(p, dict) else str(p).split("/")[0].rsplit(":", 1)[-1]
        found.append(int(target))
    return sorted(set(found))


def _rewrite(s: str, host_map: dict[str, str], own: dict[str, str]) -> str:
    table = {**host_map, **own}
    if not table:
        return s
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(k) for k in table) + r")(?!\d)")
    return pattern.sub(lambda m: table[m.group(1)], s)


def _rewrite_listen_ports(text: str, ports: dict[int, int]) -> str:
    """`port: P` lines of a service's own config file (what it listens on) to its local ports."""
    for p, local in ports.items():
        text = re.sub(rf"(\bport:\s*){p}\b", rf"\g<1>{local}", text)
    return text.replace("0.0.0.0", "127.0.0.1")


def _rewrite_port_flags(argv: list[str], ports: dict[int, int]) -> list[str]:
    out = list(argv)
    for i in range(1, len(out)):
        if out[i - 1].endswith("-port") and out[i].isdigit() and int(out[i]) in ports:
            out[i] = str(ports[int(out[i])])
    return out


def _map_argv(argv: list[str]) -> list[str]:
    """The image's console script or `python` as this interpreter."""
    if not argv:
        raise SystemExit("compose: a service without command: the runner has no image to take it from")
    head, rest = argv[0], argv[1:]
    if head in CONSOLE_SCRIPTS:
        return [sys.executable, "-m", CONSOLE_SCRIPTS[head], *rest]
    if head in ("python", "python3"):
        return [sys.executable, *rest]
    return argv


def _health_argv(test: Any, local: Callable[[str], str]) -> list[str] | None:
    if not test or test == ["NONE"]:
        return None
    if isinstance(test, str):
        return ["/bin/sh", "-c", local(test)]
    kind, *rest = test
    if kind == "CMD-SHELL":
        return ["/bin/sh", "-c", local(rest[0])]
    return _map_argv([local(a) for a in rest])


def _duration(value: str | int | float) -> float:
    total = 0.0
    for num, unit in re.findall(r"([\d.]+)(ms|us|h|m|s)?", str(value)):
        total += float(num) * {"ms": 1e-3, "us": 1e-6, "h": 3600, "m": 60}.get(unit, 1.0)
    return total


def _start_order(services: list[Service]) -> list[Service]:
    by_name = {s.name: s for s in services}
    order: list[Service] = []
    visiting: set[str] = set()

    def visit(s: Service) -> None:
        if s in order:
            return
        if s.name in visiting:
            raise SystemExit(f"compose: depends_on cycle through {s.name}")
        visiting.add(s.name)
        for d in s.depends_on:
            if d not in by_name:
                raise SystemExit(f"compose: services.{s.name}.depends_on: no service {d!r}")
            visit(by_name[d])
        order.append(s)

    for s in services:
        visit(s)
    return order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- running -------------------------------------------------------------------------------------

class Runner:
    def __init__(self, services: list[Service], cwd: Path, grace_s: float = 40.0) -> None:
        self.services, self.cwd, self.grace_s = services, cwd, grace_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = threading.Event()

    def run(self) -> int:
        healthy: set[str] = set()
        for svc in self.services:
            for dep, condition in svc.depends_on.items():
                if condition == "service_healthy" and dep not in healthy:
                    if not self._wait_healthy(next(s for s in self.services if s.name == dep)):
                        return 1
                    healthy.add(dep)
            if self.stopping.is_set():
                return 0
            self._start(svc)
        for svc in self.services:
            if svc.health and svc.name not in healthy:
                if not self._wait_healthy(svc):
                    return 1
        print("run | all services up", flush=True)
        while not self.stopping.wait(0.2):
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    print(f"run | {name} exited with {proc.returncode}: stopping", flush=True)
                    return 1
        return 0

    def _start(self, svc: Service) -> None:
        env = {**os.environ, **svc.env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(svc.argv, cwd=self.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[svc.name] = proc
        threading.Thread(target=_pump, args=(svc.name, proc), daemon=True).start()
        print(f"run | started {svc.name} (pid {proc.pid}): {shlex.join(svc.argv)}", flush=True)

    def _wait_healthy(self, svc: Service) -> bool:
        if svc.health is None:
            print(f"run | {svc.name}: service_healthy asked but it has no healthcheck", flush=True)
            return False
        deadline = time.monotonic() + svc.deadline_s
        while not self.stopping.is_set() and time.monotonic() < deadline:
            proc = self.procs[svc.name]
            if proc.poll() is not None:
                print(f"run | {svc.name} exited with {proc.returncode} before it was healthy", flush=True)
                return False
            try:
                # In the service's environment, as compose runs a healthcheck inside its container.
                passed = subprocess.run(svc.health, cwd=self.cwd, capture_output=True, timeout=svc.timeout_s,
                                        env={**os.environ, **svc.env}).returncode == 0
            except subprocess.TimeoutExpired:  # compose counts a check past its timeout as failed
                passed = False
            if passed:
                print(f"run | {svc.name} healthy", flush=True)
                return True
            self.stopping.wait(svc.interval_s)
        if not self.stopping.is_set():
            print(f"run | {svc.name} not healthy within {svc.deadline_s:.0f} s", flush=True)
        return self.stopping.is_set()

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for name, proc in reversed(self.procs.items()):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"run | {name} still running after {self.grace_s:.0f} s: SIGKILL", flush=True)
            # The group too: a service's children (engine ranks, API servers) must not outlive it.
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _pump(name: str, proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        sys.stdout.write(f"{name} | {line.decode(errors='replace')}")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="compose files, later ones override earlier ones")
    p.add_argument("--volumes-dir", type=Path, default=Path.home() / ".cache" / "fleet" / "compose-volumes",
                   help="where named volumes live (one directory each)")
    p.add_argument("--ports-file", type=Path, help="write {service: {container port: local port}} here as JSON")
    p.add_argument("--grace", type=float, default=40.0, help="seconds between SIGTERM and SIGKILL on stop")
    args = p.parse_args(argv)
    files_dir = Path(tempfile.mkdtemp(prefix="compose-"))  # the rewritten copies of bind-mounted files
    try:
        return _run(plan(load(args.files, dict(os.environ)), args.volumes_dir, files_dir), args)
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)


def _run(services: list[Service], args: argparse.Namespace) -> int:
    mapping = {s.name: {str(k): v for k, v in s.ports.items()} for s in services}
    for s in services:
        for container, local in s.ports.items():
            print(f"run | {s.name}:{container} -> 127.0.0.1:{local}", flush=True)
    if args.ports_file:
        args.ports_file.write_text(json.dumps(mapping))
    runner = Runner(services, Path(__file__).resolve().parents[2], args.grace)

    def on_signal(signum: int, _frame: object) -> None:
        runner.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return runner.run()
    finally:
        runner.stop()
        print("run | stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
