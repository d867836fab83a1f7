"""vLLM's own request events become protocol 1.4's timings and Stats counters on the vllm backend (tiny
model on CPU): a KV cache too small for the batch makes vLLM preempt, and the preemptions show in the
requests' timings and in Stats, as do the tokens of every step."""
from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator

import pytest

from protocol import ITERATION_TOKENS_BUCKETS, MINOR, Ready, Stats
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine
from tests.vllm.conftest import Reaper

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPT, GENERATED, REQUESTS = 300, 200, 6  # 4 blocks of 128 each at the end: 24 > the pool's 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, reaper: Reaper) -> Iterator[EngineProc]:
    if importlib.util.find_spec("vllm") is None:  # looked up, not imported: its engines run in processes
        pytest.skip("vllm is not installed")
    # 512 bytes of KV per token: 1 MiB holds 2048 tokens, 16 blocks of 128.
    proc = start_engine(tmp_path_factory.mktemp("vllm-metrics"), "--model", "tiny", "--backend", "vllm",
                        "--max-model-len", "1024", "--kv-cache-bytes", str(2**20))
    yield proc
    reaper.stop(proc)  # its exit code 0 checked at the session's end, while other tests run meanwhile


def _latest_stats(client: EngineClient, after: float) -> Stats:
    """The first Stats sent after `after` (engine wall clock), waiting for it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        fresh = [s for s in client.stats if s.timestamp > after]
        if fresh:
            return fresh[-1]
        client.utility("stats")  # receives (and keeps) the heartbeats meanwhile
    raise AssertionError("no Stats after the requests finished")


def test_timings_preemptions_and_iteration_tokens_from_vllm(engine: EngineProc) -> None:
    client = EngineClient(engine.endpoint())
    try:
        ready = client.handshake(timeout_s=60)
        assert isinstance(ready, Ready) and (ready.backend, ready.minor) == ("vllm", MINOR)
        ids = [f"r{i}" for i in range(REQUESTS)]
        for i, rid in enumerate(ids):  # distinct prompts: no prefix-cache hits
            client.generate(rid, [1000 + 400 * i + j for j in range(PROMPT)], max_tokens=GENERATED,
                            temperature=0.0, ignore_eos=True)
        results = client.collect(ids, timeout_s=300)
        stats = _latest_stats(client, time.time())
    finally:
        client.close()
    for rid, r in results.items():
        assert r.finish_reason == "length" and len(r.token_ids) == GENERATED, rid
        first, last = r.timings  # with the first token, and with the finish; no other output has them
        assert first.queued_time == last.queued_time >= 0 and first.prefill_time == last.prefill_time > 0
        assert first.decode_time == 0 < last.decode_time
        assert last.num_preemptions >= first.num_preemptions
    # Whoever waited for room queued longer than whoever got it at once (FCFS).
    queued = [results[rid].timings[0].queued_time for rid in ids]
    assert queued[-1] > queued[0]
    preempted = sum(r.timings[-1].num_preemptions for r in results.values())
    assert preempted > 0 and stats.num_preemptions == preempted
    # vLLM's count: each prompt's computed tokens once (recomputation after preemption is not counted),
    # plus every generated token.
    assert len(stats.iteration_tokens) == len(ITERATION_TOKENS_BUCKETS) + 1
    assert stats.iteration_tokens_sum == REQUESTS * (PROMPT + GENERATED)
    assert sum(stats.iteration_tokens) >= GENERATED  # steps with outputs: at least one per generated token
