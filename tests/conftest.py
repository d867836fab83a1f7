"""Test distribution under pytest-xdist (`make test` runs `-n 2 --dist loadgroup --no-loadscope-reorder`).

A module's tests go to one worker, so a module-scoped fleet starts once; the tests/vllm modules that use
the shared engines (tests/vllm/conftest.py) or vLLM in-process go to the same worker, so those engines and
the in-process reference vLLM start once and vllm is imported by one worker; the vllm modules that only
start processes of their own (the compose file, the metrics engine, a router's cache) are groups of their
own, free to run on the other worker. Groups are handed out longest first, so that no long group starts last
while the other worker idles: the vLLM group, then the directories whose tests start processes (and the
unit modules that do, a real PostgreSQL's), then the unit tests, which fill in at the end. (The groups are
made here, by a scheduler, and not with xdist_group marks: xdist 3.8 names a marked test by assigning
`item._nodeid`, which pytest 9 no longer reads.)

Bytecode is kept, outside the tree, when the environment says not to write it (PYTHONDONTWRITEBYTECODE):
the suite starts hundreds of Python processes (engines, frontends, routers, xdist's workers), and without
.pyc files each compiles the project's modules anew and each worker rewrites every test module's asserts
again (12 s of a worker's 30 s collection here)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.dont_write_bytecode:
    # A prefix keeps the tree as clean as not writing does (the reason to set it); this process's imports
    # from here on and every process a test starts (which inherit os.environ) read and write it.
    _PYCACHE = os.environ.get("PYTHONPYCACHEPREFIX") or str(Path.home() / ".cache" / "fleet" / "pycache")
    os.environ["PYTHONPYCACHEPREFIX"] = _PYCACHE
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = _PYCACHE
    sys.dont_write_bytecode = False

# The order groups are handed out in: the longest first. test_store starts and stops a PostgreSQL server
# (and kills and restarts it): 40 s and more, long enough to end a run late if handed out among the last.
_ORDER = ("tests/vllm/", "tests/e2e/", "tests/unit/router/test_store.py", "tests/integration/", "tests/contract/",
          "tests/unit/")


# tests/vllm modules that start only processes of their own: not tied to the shared vllm group.
_OWN_PROCESSES = ("tests/vllm/test_metrics_vllm.py",
                  "tests/vllm/test_router_cache_vllm.py")


def _group(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "tests/vllm" if module.startswith("tests/vllm/") and module not in _OWN_PROCESSES else module


def _rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(_ORDER) if nodeid.startswith(prefix)), len(_ORDER))


def _loadgroup(config: pytest.Config) -> bool:
    # The controller has the option as given; xdist rewrites it on its workers to dist=no, loadgroup=True.
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _loadgroup(config):
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: each group keeps its own order


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not _loadgroup(config):
        return None  # xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return GroupScheduling(config, log)
