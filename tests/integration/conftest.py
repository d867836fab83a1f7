from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, HttpProc, start_backend, start_engine

SIM = ("--model", "tiny", "--backend", "sim")
SIM_ENGINE = (*SIM, "--sim-decode-ms", "2", "--client-timeout", "1.0")


@pytest.fixture(scope="module")
def sim_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """One sim rank, real timing (2 ms base decode step) so steps are observable; shared by the module's
    tests, so none may stop it, and a test that needs a cold prefix cache starts its own (SIM_ENGINE)."""
    engine = start_engine(tmp_path_factory.mktemp("sim-engine"), *SIM_ENGINE)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProc]:
    """The OpenAI-compatible test backend (tests/support/openai_backend.py, answering "a:<model>"), one per
    module: the chat pool of the router tests that need one (reset() it after a test that configures it)."""
    proc = start_backend(tmp_path_factory.mktemp("backend"), "a")
    yield proc
    proc.stop()


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
