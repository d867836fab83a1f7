from __future__ import annotations

from protocol import RequestOutput
from protocol.block_hash import ROOT, block_hashes
from services.engine.backends.sim import SimConfig
from services.engine.backends.sim.block_pool import BlockPool
from services.engine.backends.sim.scheduler import Scheduler, SimRequest

TOKEN = 7  # the fake sampler's only token


def fake_sample(req: SimRequest) -> RequestOutput:
    """Fixed token; finishes at max_len, like the backend's length rule."""
    req.token_ids.append(TOKEN)
    done = len(req.token_ids) >= req.max_len
    finish = "length" if done else None
    return RequestOutput(req.request_id, [TOKEN], finish, None, req.num_cached_tokens)


def make(config: SimConfig) -> Scheduler:
    return Scheduler(config, BlockPool(config.num_kv_blocks, config.block_size), fake_sample)


def request(
    rid: str, prompt: list[int], *, max_tokens: int = 4, priority: int = 0, arrival: float = 0.0,
    block_size: int = 16,
) -> SimRequest:
    return SimRequest(
        request_id=rid,
        token_ids=list(prompt),
        num_prompt=len(prompt),
        hashes=block_hashes(prompt, block_size),
        root=ROOT,
        lora=None,
        priority=priority,
        arrival=arrival,
        rand=lambda: 0.0,
        max_len=len(prompt) + max_tokens,
        min_len=len(prompt),
        stop_ids=None,
        eos_rate=0.0,
    )


def run_all(s: Scheduler, max_steps: int = 10_000) -> dict[str, list[RequestOutput]]:
    seen: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not s.requests:
            return seen
        for out in s.step().outputs:
            seen.setdefault(out.request_id, []).append(out)
    raise AssertionError(f"no progress: {len(s.requests)} requests left")


def test_first_token_comes_with_the_step_that_completes_prefill() -> None:
    s = make(SimConfig())
    s.add(request("a", list(range(10))))
    work = s.step()
    assert [(o.request_id, o.new_token_ids) for o in work.outputs] == [("a", [TOKEN])]
    assert (work.prefill_tokens, work.num_decodes) == (10, 0)
    work = s.step()
    assert (work.prefill_tokens, work.num_decodes) == (0, 1)


def test_token_budget_chunks_a_long_prompt() -> None:
    s = make(SimConfig(max_num_batched_tokens=1024))
    s.add(request("long", list(range(3000))))
    chunks = []
    for _ in range(3):
        work = s.step()
        chunks.append((work.prefill_tokens, len(work.outputs)))
    assert chunks == [(1024, 0), (1024, 0), (952, 1)]


def test_decodes_and_chunked_prefill_share_the_budget() -> None:
    s = make(SimConfig(max_num_batched_tokens=64, max_num_seqs=4))
    s.add(request("a", list(range(10)), max_tokens=100))
    s.step()
    s.add(request("b", list(range(100, 300))))
    work = s.step()
    assert (work.num_decodes, work.prefill_tokens) == (1, 63)
    assert [o.request_id for o in work.outputs] == ["a"]


def test_max_num_seqs_bounds_the_running_batch() -> None:
    s = make(SimConfig(max_num_seqs=2))
    for i in range(5):
        s.add(request(f"r{i}", [i] * 8, max_tokens=3))
    s.step()
    assert (len(s.running), s.num_waiting) == (2, 3)
    finished = set()
    while s.requests:
        outputs = s.step().outputs
        assert len(outputs) <= 2 and len(s.running) <= 2
        finished |= {o.request_id for o in outputs if o.finish_reason}
    assert finished == {f"r{i}" for i in range(5)}


def test_waiting_requests_admitted_by_priority_then_arrival() -> None:
    s = make(SimConfig(max_num_seqs=1))
    s.add(request("c", [1] * 8, max_tokens=1, priority=1, arrival=0.0))
    s.add(request("b", [2] * 8, max_tokens=1, priority=0, arrival=2.0))
    s.add(request("a", [3] * 8, max_tokens=1, priority=0, arrival=1.0))
    order = [o.request_id for _ in range(3) for o in s.step().outputs]
    assert order == ["a", "b", "c"]


def test_prefix_hit_skips_cached_full_blocks_only() -> None:
    s = make(SimConfig())
    prompt = list(range(40))
    s.add(request("first", prompt))
    assert run_all(s)["first"][0].num_cached_tokens == 0
    s.add(request("second", prompt))
    work = s.step()
    assert work.outputs[0].num_cached_tokens == 32  # two full blocks; the partial one is computed
    assert work.prefill_tokens == 8
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (80, 32)


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    s = make(SimConfig())
    prompt = list(range(32))
    s.add(request("first", prompt))
    run_all(s)
    s.add(request("second", prompt))
    work = s.step()
    assert work.outputs[0].num_cached_tokens == 16
    assert work.prefill_tokens == 16


def test_generated_tokens_fill_cacheable_blocks() -> None:
    s = make(SimConfig())
    s.add(request("first", list(range(12)), max_tokens=8))
    outs = run_all(s)["first"]
    full = list(range(12)) + [TOKEN] * len(outs)
    s.add(request("second", full))
    assert s.step().outputs[0].num_cached_tokens == 16  # 12 prompt + 4 generated tokens


def test_preemption_recomputes_the_most_recent_request_and_all_finish() -> None:
    # 6 blocks of 4 tokens; three requests that each grow to 16 tokens (4 blocks) cannot all fit.
    config = SimConfig(block_size=4, num_kv_blocks=6, max_model_len=24, max_num_seqs=3)
    s = make(config)
    for i in range(3):
        s.add(request(f"r{i}", [10 * i + 1] * 4, max_tokens=12, block_size=4))
    tokens: dict[str, int] = {}
    preempted = []
    for _ in range(1000):
        if not s.requests:
            break
        before = list(s.running)
        outputs = s.step().outputs
        done = {o.request_id for o in outputs if o.finish_reason}
        gone = [r.request_id for r in before if r not in s.running and r.request_id not in done]
        if gone:
            assert gone == [before[-1].request_id]  # the most recently admitted one
            assert all(r in before for r in s.running)  # nothing is admitted in a preempting step
            preempted += gone
        for o in outputs:
            tokens[o.request_id] = tokens.get(o.request_id, 0) + len(o.new_token_ids)
    assert not s.requests
    assert preempted
    assert tokens == {"r0": 12, "r1": 12, "r2": 12}
    assert s.pool.num_free == 6


def test_a_preempting_step_admits_nothing() -> None:
    s = make(SimConfig(block_size=4, num_kv_blocks=8, max_model_len=32, max_num_seqs=2))
    s.add(request("r0", [1] * 4, max_tokens=8, block_size=4))  # 1 block, needs a 2nd to decode
    s.add(request("r1", [2] * 27, max_tokens=4, block_size=4))  # the other 7 blocks
    s.step()
    assert s.pool.num_free == 0
    s.add(request("urgent", [3] * 2, max_tokens=1, priority=-1, block_size=4))
    work = s.step()
    assert [o.request_id for o in work.outputs] == ["r0"]
    assert ([r.request_id for r in s.running], s.num_waiting) == (["r0"], 2)
    assert [o.request_id for o in s.step().outputs] == ["r0", "urgent"]


def test_abort_frees_blocks_and_drops_waiting_requests() -> None:
    s = make(SimConfig(max_num_seqs=1))
    s.add(request("running", list(range(40)), max_tokens=100))
    s.add(request("waiting", list(range(100, 140))))
    s.step()
    assert s.pool.usage() > 0 and s.num_waiting == 1
    s.abort(["running", "waiting", "unknown"])
    assert s.pool.usage() == 0.0
    assert (len(s.running), s.num_waiting, s.requests) == (0, 0, {})
    assert s.step().outputs == []


def test_timed_outputs_are_each_requests_first_token_and_its_finish() -> None:
    s = make(SimConfig(max_num_batched_tokens=16, max_num_seqs=4))
    s.add(request("a", list(range(40)), max_tokens=3))  # three chunks of prefill, then 3 tokens
    steps = [s.step(now=float(t)) for t in range(5)]
    assert [[(r.request_id, o.new_token_ids, o.finish_reason) for r, o in w.timed] for w in steps] == [
        [], [], [("a", [TOKEN], None)], [], [("a", [TOKEN], "length")]]
    assert all(o is steps[2].outputs[0] for _, o in steps[2].timed)
    req = steps[2].timed[0][0]
    assert (req.scheduled_at, req.num_preemptions, s.num_preemptions) == (0.0, 0, 0)  # its first chunk's step


def test_a_request_finishing_with_its_first_token_is_timed_once() -> None:
    s = make(SimConfig())
    s.add(request("one", list(range(8)), max_tokens=1))
    work = s.step(now=3.0)
    assert [(r.request_id, o.finish_reason) for r, o in work.timed] == [("one", "length")]
    assert work.timed[0][0].scheduled_at == 3.0


def test_preemptions_are_counted_per_request_and_in_total_and_keep_the_first_scheduling() -> None:
    # As test_preemption_recomputes_the_most_recent_request_and_all_finish: 3 requests of up to 4 blocks, 6 blocks.
    config = SimConfig(block_size=4, num_kv_blocks=6, max_model_len=24, max_num_seqs=3)
    s = make(config)
    reqs = [request(f"r{i}", [10 * i + 1] * 4, max_tokens=12, block_size=4) for i in range(3)]
    for r in reqs:
        s.add(r)
    events = 0
    first_scheduled: dict[str, float] = {}
    for t in range(1000):
        if not s.requests:
            break
        before = list(s.running)
        work = s.step(now=float(t))
        done = {o.request_id for o in work.outputs if o.finish_reason}
        events += sum(1 for r in before if r not in s.running and r.request_id not in done)
        for r in s.running:
            first_scheduled.setdefault(r.request_id, float(t))
    assert events > 0
    assert s.num_preemptions == events == sum(r.num_preemptions for r in reqs)
    assert {r.request_id: r.scheduled_at for r in reqs} == first_scheduled  # not moved by a re-admission
