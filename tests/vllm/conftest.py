"""vLLM tests run the engine in-process and never reach a model hub; both are
read from the environment, so set them before any test imports vllm.

Starting a vLLM engine costs tens of seconds here, so modules that need the same engine share one:
`shared` starts each distinct command line once and stops it when the last test of tests/vllm that could
use it is done (it is package-scoped: under `make test` that is the end of the worker's vllm group, not the
session's end, so idle engines do not take CPU from the rest of the suite). A vLLM process takes seconds to
exit after it drained (its interpreter's teardown), so processes are stopped without waiting: `reaper` waits
for them, and checks each exited 0, at the session's end.
The same goes for vLLM's offline LLM (the reference the engine is compared with): one per checkpoint,
`llm` for the tiny model and `minilm_llm`, `classifier_llm`, `cross_encoder_llm` for the pooling
checkpoints, which all live in this process together (each with a 4 MiB KV budget), package-scoped too: their
teardown (seconds) happens at the vllm group's end, not at the session's end, where it would delay the run's
last test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from tests.support.procs import EngineProc, FrontendProc, Proc, start_engine, start_frontend

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# 512 bytes of KV per token (2 layers x K,V x 2 heads x 32 dims x bf16): 4 MiB
# holds 8192 tokens, far more than max_model_len.
KV_CACHE_BYTES = 4 * 2**20

# The engine test_engine_vllm drives over the protocol (two ranks from one command), whose rank 0 also
# serves the frontend of test_frontend_vllm and test_preprocess_vllm.
ENGINE_ARGS = ("--model", "tiny", "--backend", "vllm", "--max-model-len", "1024", "--kv-cache-bytes", str(16 * 2**20))
ENGINE_RANKS = 2

# The pooling checkpoints' limits, for both the engines (`pooling_engine`) and the offline references.
# MiniLM's sentence-transformers max_seq_length: vLLM refuses a longer --max-model-len for it.
POOLING_MAX_MODEL_LEN = {"minilm": 256, "tiny-classifier": 512, "tiny-cross-encoder": 512}


class SharedProcs:
    """Engines and frontends keyed by their command line: the first test that asks starts one, later
    ones get the same process."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._procs: dict[tuple[Any, ...], Proc] = {}

    def engine(self, *args: str, ranks: int = 1) -> EngineProc:
        key = ("engine", ranks, *args)
        if key not in self._procs:
            self._procs[key] = start_engine(self._tmp, *args, ranks=ranks)
        proc = self._procs[key]
        assert isinstance(proc, EngineProc) and proc.proc.poll() is None, proc.log()
        return proc

    def frontend(self, *args: str) -> FrontendProc:
        key = ("frontend", *args)
        if key not in self._procs:
            self._procs[key] = start_frontend(self._tmp, *args)
        proc = self._procs[key]
        assert isinstance(proc, FrontendProc) and proc.proc.poll() is None, proc.log()
        return proc

    def stop(self, reaper: Reaper) -> list[str]:
        """Stop everything: the frontends first, all at once, waited for (they exit in well under a second);
        then the engines they used, all at once, handed to `reaper` (each takes seconds to exit). The logs
        of the frontends that failed to exit 0."""
        procs = list(self._procs.values())
        frontends = [p for p in procs if isinstance(p, FrontendProc)]
        for proc in frontends:
            proc.terminate()
        failed = [proc.log() for proc in frontends if proc.wait_stopped() != 0]
        for proc in procs:
            if isinstance(proc, EngineProc):
                reaper.stop(proc)
        self._procs.clear()
        return failed


class Reaper:
    """Processes sent SIGTERM and left to exit in the background while other tests run; `reap` waits for
    each (SIGKILL after its timeout, as Proc.stop) and gives the logs of those that did not exit 0."""

    def __init__(self) -> None:
        self._procs: list[Proc] = []

    def stop(self, proc: Proc) -> None:
        proc.terminate()
        self._procs.append(proc)

    def reap(self) -> list[str]:
        failed = [f"exit code {code}:\n{proc.log()}" for proc in self._procs if (code := proc.wait_stopped()) != 0]
        self._procs.clear()
        return failed


@pytest.fixture(scope="session")
def reaper() -> Iterator[Reaper]:
    """Where tests/vllm's modules leave the processes they stopped; each must have exited 0 by the end."""
    procs = Reaper()
    yield procs
    failed = procs.reap()
    assert not failed, "\n\n".join(failed)


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory, reaper: Reaper) -> Iterator[SharedProcs]:
    procs = SharedProcs(tmp_path_factory.mktemp("vllm-shared"))
    yield procs
    failed = procs.stop(reaper)
    assert not failed, "\n\n".join(failed)


@pytest.fixture(scope="package")
def vllm_engine(shared: SharedProcs) -> EngineProc:
    """Two vLLM ranks from one command (each rank its own process, as on a GPU node)."""
    pytest.importorskip("vllm")
    return shared.engine(*ENGINE_ARGS, ranks=ENGINE_RANKS)


@pytest.fixture(scope="package")
def vllm_frontend(shared: SharedProcs, vllm_engine: EngineProc) -> FrontendProc:
    """A frontend on rank 0 of `vllm_engine`."""
    return shared.frontend("--data-parallel-size", "1", "--data-parallel-size-local", "0",
                           "--engine-addresses", vllm_engine.endpoint(0))


@pytest.fixture(scope="package")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """vLLM's own offline engine on the tiny model: the reference our engine is compared with."""
    vllm = pytest.importorskip("vllm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEET_CACHE_DIR", str(tmp_path_factory.mktemp("fleet-cache")))
        path = checkpoints.resolve("tiny", weights=True)
    engine = vllm.LLM(model=str(path), max_model_len=512, kv_cache_memory_bytes=KV_CACHE_BYTES,
                      enforce_eager=True, dtype="bfloat16", seed=0)
    yield engine
    del engine


def pooling_engine(shared: SharedProcs, name: str) -> EngineProc:
    """The one engine per run of tests/vllm serving `name` with the pooling runner: the same command line for every
    module, so test_engine_pooling_vllm, test_engine_classify_vllm, test_frontend_pooling_vllm and
    test_pooling_vllm talk to one process per checkpoint (each client or frontend its own peer)."""
    pytest.importorskip("vllm")
    return shared.engine("--model", name, "--backend", "vllm", "--runner", "pooling",
                         "--max-model-len", str(POOLING_MAX_MODEL_LEN[name]), "--kv-cache-bytes", str(KV_CACHE_BYTES))


@pytest.fixture(scope="package")
def minilm_engine(shared: SharedProcs) -> EngineProc:
    return pooling_engine(shared, "minilm")


@pytest.fixture(scope="package")
def classifier_engine(shared: SharedProcs) -> EngineProc:
    return pooling_engine(shared, "tiny-classifier")


@pytest.fixture(scope="package")
def cross_encoder_engine(shared: SharedProcs) -> EngineProc:
    return pooling_engine(shared, "tiny-cross-encoder")


def _offline_pooling(name: str) -> Iterator[Any]:
    vllm = pytest.importorskip("vllm")
    path = checkpoints.resolve(name, weights=True)
    engine = vllm.LLM(model=str(path), runner="pooling", max_model_len=POOLING_MAX_MODEL_LEN[name],
                      kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=True, seed=0)
    yield engine
    del engine


@pytest.fixture(scope="package")
def minilm_llm() -> Iterator[Any]:
    """vLLM's offline pooling engine on `minilm`, with the limits of `minilm_engine`."""
    yield from _offline_pooling("minilm")


@pytest.fixture(scope="package")
def classifier_llm() -> Iterator[Any]:
    yield from _offline_pooling("tiny-classifier")


@pytest.fixture(scope="package")
def cross_encoder_llm() -> Iterator[Any]:
    yield from _offline_pooling("tiny-cross-encoder")
