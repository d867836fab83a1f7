"""The router package's import graph, read from the source: no circles (every import statement counts,
TYPE_CHECKING blocks and function-level imports too), and nothing of another service."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "services.router"


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "services" / "router").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module `name` imports, as the names its import statements give them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:  # `from pkg import module` imports the module
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for target in _imports(name, path, modules):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def test_no_import_circles() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, path + [name])
        done.add(name)

    assert len(graph) > 20  # the walk found the package
    for name in sorted(graph):
        visit(name, [])


def test_the_router_imports_no_other_service() -> None:
    modules = _modules()
    foreign = {f"{name}: {target}" for name, path in modules.items() for target in _imports(name, path, modules)
               if target.startswith("services.") and not target.startswith(PACKAGE + ".") and target != PACKAGE}
    assert foreign == set()
