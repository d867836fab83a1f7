from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine

SIM = ("--model", "tiny", "--backend", "sim")


@pytest.fixture
def sim_engine(tmp_path: Path) -> Iterator[EngineProc]:
    """One sim rank, real timing (2 ms base decode step) so steps are observable."""
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "2", "--client-timeout", "1.0")
    yield engine
    engine.stop()


@pytest.fixture
def client_factory(sim_engine: EngineProc) -> Iterator:  # type: ignore[type-arg]
    clients: list[EngineClient] = []

    def make(**kw: object) -> EngineClient:
        c = EngineClient(sim_engine.endpoint(), **kw)  # type: ignore[arg-type]
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
