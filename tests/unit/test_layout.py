"""The package layout DESIGN.md asks for, read from the source with `ast`: no import circles inside a
service, the protocol or a shared library (every import counts: module level, inside functions, under
TYPE_CHECKING); services never import each other (they import `protocol` and the shared pure libraries);
`protocol` needs nothing but the stdlib and msgspec; the shared libraries are pure: no sockets, no event
loop, no threads, never a service."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("services.engine", "services.frontend", "services.router")
# The shared pure libraries, each with the third-party packages it may use.
SHARED = {"checkpoints": {"safetensors", "torch"}, "prompting": {"minijinja", "tokenizers"},
          "edge": set(),
          # OpenTelemetry's API and SDK: the exporter's threads and sockets are the SDK's, started by the
          # process that configures it; the library itself opens none and imports no service.
          "tracing": {"opentelemetry"}}
PACKAGES = ("protocol", *SHARED, *SERVICES)
# What "pure" rules out: sockets, event loops, threads and processes, and every networking library.
IMPURE = {"socket", "asyncio", "threading", "multiprocessing", "subprocess", "concurrent", "selectors", "zmq",
          "grpc", "h2", "hyperframe", "uvloop", "aiohttp", "starlette", "uvicorn", "hypercorn", "httpx", "services"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str) -> dict[str, Path]:
    base = ROOT.joinpath(*package.split("."))
    return {_module_name(p): p for p in sorted(base.rglob("*.py"))}


def _imports(path: Path, name: str) -> set[str]:
    """Every module name an import statement in the file mentions (absolute, as written or resolved)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one (_graph trims a name that
            # is no module back to pkg), so `from pkg import mod` does not count as importing pkg's __init__.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in _imports(path, name):
            # An import of a.b.c also runs a/__init__ and a/b/__init__; the edge that matters is to the
            # module named, so take the longest name that is one of ours.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package: str) -> None:
    graph = _graph(package)
    assert len(graph) > 1, "the walk found no package"
    cycles = _cycles(graph)
    assert not cycles, f"import circles in {package}: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", SERVICES)
def test_services_never_import_each_other(package: str) -> None:
    others = [p for p in SERVICES if p != package]
    for name, path in _modules(package).items():
        for target in _imports(path, name):
            assert not any(target == o or target.startswith(o + ".") for o in others), \
                f"{name} imports {target}: services share `protocol` and the shared libraries, never each other"


@pytest.mark.parametrize("package", SHARED)
def test_shared_libraries_are_pure(package: str) -> None:
    allowed = SHARED[package] | set(SHARED) | {"protocol", "msgspec", "msgpack"}
    for name, path in _modules(package).items():
        for target in _imports(path, name):
            top = target.split(".")[0]
            assert top not in IMPURE, f"{name} imports {target}: a shared library is pure (no I/O, no service)"
            assert top in allowed or top in sys.stdlib_module_names, f"{name} imports {target}"


# Each service's layers, lowest first: a module may import its own package and lower layers, never a higher
# layer or a sibling in its own (siblings are the packages or modules of one layer). Names are the first part
# below the service; every one of its modules must be placed.
LAYERS = {
    "services.frontend": [
        ("errors", "text", "parsers"),
        ("config", "model"),
        ("engine_client",),
        ("requests",),
        ("generation",),
        ("http_api", "grpc_api"),  # siblings: HTTP and gRPC share the generation core, never each other
        ("managed",), ("server",), ("__main__",),
    ],
    "services.engine": [
        ("config", "backend", "bridge", "peers", "probe", "token_histogram", "utility", "validation", "weights",
         "kv_sizing", "request_trace"),
        ("backends",),
        ("core", "wiring"),
        ("launcher",), ("__main__",),
    ],
    "services.router": [
        ("config", "errors", "metrics", "parent_death"),
        ("backends",),  # chat pools and the replica scheduling the model runtime shares
        ("runtime",),  # decision-model deployments, on the backends' scheduling
        ("decision",),  # signals ask the runtime's port
        ("plugins",),  # hooks and their store: recall embeds through the runtime's port
        ("listeners",),
        ("app", "modes"),  # modes: the command line's configs (engine mode, the default decision model)
        ("server",), ("__main__",),
    ],
}


def _layer_violations(service: str, layers: list[tuple[str, ...]]) -> list[str]:
    where = {part: (i, part) for i, group in enumerate(layers) for part in group}
    graph = _graph(service)
    found = []
    for name, targets in graph.items():
        part = name[len(service) + 1:].split(".")[0] if name != service else ""
        if not part:
            continue
        assert part in where, f"{name}: {part!r} has no place in the layers of {service}"
        level, own = where[part]
        for target in targets:
            other = target[len(service) + 1:].split(".")[0] if target.startswith(service + ".") else ""
            if not other or other == own:
                continue
            if where[other][0] >= level:
                found.append(f"{name} -> {target}")
    return found


@pytest.mark.parametrize("service", LAYERS)
def test_each_service_imports_down_its_layers(service: str) -> None:
    violations = _layer_violations(service, LAYERS[service])
    assert not violations, f"imports that run up or across the layers of {service}: " + "; ".join(violations)


def test_the_layer_check_finds_an_upward_import() -> None:
    # The router's listeners import its backends (a lower layer): with the two swapped, that is upward.
    assert _layer_violations("services.router", [("config", "errors", "metrics", "parent_death"),
                                                 ("listeners", "decision", "plugins"), ("backends", "runtime"),
                                                 ("app", "modes"), ("server",), ("__main__",)])


def test_protocol_is_pure() -> None:
    """The engine protocol needs msgspec only. The gRPC schema (protocol.grpc) also needs grpcio and
    protobuf, and nothing else in `protocol` imports it, so an engine never loads them."""
    allowed = {"msgspec", "msgpack", "protocol"}
    grpc_allowed = allowed | {"grpc", "grpc_tools", "google"}
    for name, path in _modules("protocol").items():
        in_grpc = name == "protocol.grpc" or name.startswith("protocol.grpc.")
        for target in _imports(path, name):
            top = target.split(".")[0]
            assert top in (grpc_allowed if in_grpc else allowed) or top in sys.stdlib_module_names, \
                f"{name} imports {target}"
            assert in_grpc or not (target == "protocol.grpc" or target.startswith("protocol.grpc.")), \
                f"{name} imports {target}: the engine protocol does not load the gRPC schema"


def test_the_checker_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
