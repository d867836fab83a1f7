"""The layout's figures: per package, its modules, the import arrows between them (as
tests/unit/test_layout.py counts them: every import, module level or not), import circles, and its
largest module. Reads the source only.

Usage: .venv/bin/python bench/layout.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    spec = importlib.util.spec_from_file_location("layout", ROOT / "tests" / "unit" / "test_layout.py")
    assert spec is not None and spec.loader is not None
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    print(f"{'package':<20}{'modules':>8}{'arrows':>8}{'circles':>8}  largest module (lines)")
    for package in layout.PACKAGES:
        graph = layout._graph(package)
        sizes = {name: len(path.read_text().splitlines()) for name, path in layout._modules(package).items()}
        largest = max(sizes, key=lambda name: sizes[name])
        print(f"{package:<20}{len(graph):>8}{sum(map(len, graph.values())):>8}{len(layout._cycles(graph)):>8}"
              f"  {largest} ({sizes[largest]})")


if __name__ == "__main__":
    main()
