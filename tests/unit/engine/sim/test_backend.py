from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol import GenerateRequest, SamplingParams
from protocol.block_hash import block_hashes
from services.engine.backend import (
    Backend,
    Cleared,
    Removed,
    RequestRejected,
    Stored,
    UtilityUnsupported,
)
from services.engine.backends.sim import SimBackend, SimConfig
from services.engine.backends.sim.script import Rule, Script
from tests.support.adapters import fake_adapter

VOCAB = 1000
EOS = 1000  # a special token past the regular vocabulary, as in real tokenizers
REPO = Path(__file__).resolve().parents[4]


def backend(**overrides: Any) -> SimBackend:
    config = SimConfig(**{"instant": True, **overrides})
    return SimBackend(config, model="sim-model", vocab_size=VOCAB, eos_token_id=EOS)


def req(
    prompt: list[int], *, rid: str = "r", lora: str | None = None, salt: str | None = None,
    **sampling: Any,
) -> GenerateRequest:
    params = SamplingParams(**{"max_tokens": 16, **sampling})
    return GenerateRequest(rid, prompt, params, 0.0, lora=lora, cache_salt=salt)


def run(b: SimBackend, *requests: GenerateRequest) -> dict[str, dict[str, Any]]:
    """Step until idle; per request its tokens, finish and stop reason, and cached tokens."""
    for r in requests:
        b.add(r.request_id, r)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(10_000):
        if not b.has_work():
            return seen
        for out in b.step().outputs:
            entry = seen.setdefault(out.request_id, {"tokens": []})
            entry["tokens"] += out.new_token_ids
            entry["finish"] = out.finish_reason
            entry["stop"] = out.stop_reason
            entry["cached"] = out.num_cached_tokens
    raise AssertionError("backend never went idle")


PROMPT = list(range(1, 41))


def test_implements_every_member_of_the_backend_port() -> None:
    b: Backend = backend()  # the static check; the loop below is the runtime one
    members = [m for m in vars(Backend) if not m.startswith("_")] + ["info"]
    assert all(hasattr(b, m) for m in members), members


def test_info_describes_the_sim() -> None:
    info = backend(block_size=32, num_kv_blocks=256, max_model_len=2048).info
    assert (info.name, info.model) == ("sim", "sim-model")
    assert (info.vocab_size, info.eos_token_id) == (VOCAB, EOS)
    assert (info.block_size, info.num_kv_blocks, info.max_model_len) == (32, 256, 2048)


def test_same_prompt_same_tokens_in_fresh_backends_and_other_seeds_differ() -> None:
    first = run(backend(), req(PROMPT))["r"]["tokens"]
    assert run(backend(), req(PROMPT))["r"]["tokens"] == first
    assert all(0 <= t < VOCAB for t in first)
    assert run(backend(seed=1), req(PROMPT))["r"]["tokens"] != first
    assert run(backend(), req(PROMPT[:-1] + [999]))["r"]["tokens"] != first
    seeded = run(backend(), req(PROMPT, seed=5))["r"]["tokens"]
    assert run(backend(seed=3), req(PROMPT, seed=5))["r"]["tokens"] == seeded != first
    assert run(backend(), req(PROMPT, seed=6))["r"]["tokens"] != seeded


def test_tokens_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "import json\n"
        "from protocol import GenerateRequest, SamplingParams\n"
        "from services.engine.backends.sim import SimBackend, SimConfig\n"
        "b = SimBackend(SimConfig(instant=True), model='m', vocab_size=1000, eos_token_id=1000)\n"
        "b.add('r', GenerateRequest('r', list(range(1, 41)), SamplingParams(max_tokens=16), 0.0))\n"
        "out = []\n"
        "while b.has_work():\n"
        "    out += [t for o in b.step().outputs for t in o.new_token_ids]\n"
        "print(json.dumps(out))\n"
    )
    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
            cwd=REPO,
        )
        results.append(json.loads(proc.stdout))
    assert results[0] == results[1] == run(backend(), req(PROMPT))["r"]["tokens"]


def test_max_tokens_finishes_with_length() -> None:
    result = run(backend(), req(PROMPT, max_tokens=5))["r"]
    assert (len(result["tokens"]), result["finish"], result["stop"]) == (5, "length", None)


def test_model_length_finishes_with_length() -> None:
    b = backend(max_model_len=48, num_kv_blocks=16)
    result = run(b, req(PROMPT, max_tokens=100))["r"]
    assert (len(PROMPT) + len(result["tokens"]), result["finish"]) == (48, "length")


def test_eos_rate_one_stops_at_once_with_eos_included() -> None:
    result = run(backend(eos_rate=1.0), req(PROMPT))["r"]
    assert (result["tokens"], result["finish"], result["stop"]) == ([EOS], "stop", None)


def test_min_tokens_holds_back_eos() -> None:
    result = run(backend(eos_rate=1.0), req(PROMPT, min_tokens=5))["r"]
    assert len(result["tokens"]) == 6 and EOS not in result["tokens"][:5]
    assert (result["tokens"][-1], result["finish"]) == (EOS, "stop")


def test_ignore_eos_runs_to_max_tokens() -> None:
    result = run(backend(eos_rate=1.0), req(PROMPT, ignore_eos=True, max_tokens=20))["r"]
    assert (len(result["tokens"]), result["finish"]) == (20, "length")
    assert EOS not in result["tokens"]


def test_eos_inside_the_regular_vocab_comes_only_from_eos_rate() -> None:
    b = SimBackend(SimConfig(instant=True), model="m", vocab_size=2, eos_token_id=1)
    result = run(b, req(PROMPT, max_tokens=50))["r"]
    assert (result["tokens"], result["finish"]) == ([0] * 50, "length")


def test_stop_token_id_finishes_there_with_it_as_stop_reason() -> None:
    first = run(backend(), req(PROMPT, max_tokens=16))["r"]["tokens"]
    at = next(i for i in range(3, 16) if first[i] not in first[:i])
    result = run(backend(), req(PROMPT, max_tokens=16, stop_token_ids=[first[at]]))["r"]
    assert result["tokens"] == first[: at + 1]
    assert (result["finish"], result["stop"]) == ("stop", first[at])


def test_stop_token_is_masked_before_min_tokens() -> None:
    first = run(backend(), req(PROMPT, max_tokens=16))["r"]["tokens"]
    stop = first[0]
    result = run(backend(), req(PROMPT, max_tokens=16, min_tokens=4, stop_token_ids=[stop]))["r"]
    assert stop not in result["tokens"][:4]
    assert len(result["tokens"]) > 4


def test_repeated_prefix_reports_cached_full_blocks() -> None:
    b = backend()
    assert run(b, req(PROMPT, rid="a"))["a"]["cached"] == 0
    assert run(b, req(PROMPT + [7, 8], rid="b"))["b"]["cached"] == 32
    assert run(b, req(PROMPT, rid="c", salt="tenant"))["c"]["cached"] == 0
    load = b.load()
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (122, 32)


def test_stored_events_carry_protocol_hashes_of_prompt_and_output(tmp_path: Path) -> None:
    b = backend()
    b.utility("add_lora", {"name": "ad", "path": str(fake_adapter(tmp_path))})
    # A 5-token prompt: its first full block is mostly generated tokens, still on the salted chain.
    for prompt, salt, lora in ((PROMPT, None, None), (PROMPT, "s", "ad"), (PROMPT[:5], "s", None)):
        b.add("r", req(prompt, max_tokens=30, salt=salt, lora=lora))
        tokens = list(prompt)
        stored: list[Stored] = []
        while b.has_work():
            result = b.step()
            tokens += [t for o in result.outputs for t in o.new_token_ids]
            stored += [e for e in result.kv_events if isinstance(e, Stored)]
        expected = block_hashes(tokens, 16, salt=salt, lora=lora)[: (len(tokens) - 1) // 16]
        assert [h for e in stored for h in e.block_hashes] == expected
        assert [t for e in stored for t in e.token_ids] == tokens[: 16 * len(expected)]
        parents = [None] + expected
        firsts = [expected.index(e.block_hashes[0]) for e in stored]
        assert [e.parent_block_hash for e in stored] == [parents[i] for i in firsts]
        assert {e.lora for e in stored} == {lora}


def test_kv_events_stay_consistent_under_churn() -> None:
    """Shared prefixes, a small pool (evictions, preemptions) and aborts: a subscriber replaying the
    events never sees a hash stored twice or removed while absent, and ends in the pool's state."""
    b = backend(block_size=4, num_kv_blocks=48, max_model_len=64, max_num_seqs=8)
    rng = random.Random(0)
    prefixes = [[rng.randrange(VOCAB) for _ in range(12)] for _ in range(3)]
    held: set[int] = set()
    finished = 0

    def step() -> None:
        nonlocal finished
        result = b.step()
        finished += sum(o.finish_reason is not None for o in result.outputs)
        for event in result.kv_events:
            if isinstance(event, Stored):
                assert held.isdisjoint(event.block_hashes)
                held.update(event.block_hashes)
            elif isinstance(event, Removed):
                assert held.issuperset(event.block_hashes)
                held.difference_update(event.block_hashes)

    for i in range(60):
        prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
        b.add(f"r{i}", req(prompt, rid=f"r{i}", max_tokens=rng.randrange(1, 30)))
        if i % 7 == 3:
            b.abort([f"r{i - 1}"])
        for _ in range(rng.randrange(0, 4)):
            step()
    while b.has_work():
        step()
    assert finished == 60 - len(range(3, 60, 7))
    assert b.load().kv_usage == 0.0
    assert len(held) == b._pool.num_cached


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (req([]), "prompt_token_ids"),
        (req(list(range(64))), "max_model_len"),
        (req([1, -1]), "prompt_token_ids"),
        (req([1, 2**31]), "prompt_token_ids"),
        (req([1], lora="missing"), "lora"),
        (req([1], max_tokens=0), "max_tokens"),
        (req([1], min_tokens=17), "min_tokens"),
        # Refused, not ignored: the sim cannot make its output match a schema.
        (req([1], json_schema='{"type": "object"}'), "sampling.json_schema: the sim backend cannot honour it"),
        (req([1], regex="a+"), "sampling.regex: the sim"),
        (req([1], choice=["a"]), "sampling.choice: the sim"),
        (req([1], grammar='root ::= "a"'), "sampling.grammar: the sim"),
        (req([1], json_object=True), "sampling.json_object: the sim"),
        (req([1], structural_tag="{}"), "sampling.structural_tag: the sim"),
        (req([1], logit_bias={1: 5.0}), "sampling.logit_bias: the sim"),
        (req([1], allowed_token_ids=[1]), "sampling.allowed_token_ids: the sim"),
        (req([1], bad_words=["x"]), "sampling.bad_words: the sim"),
    ],
)
def test_rejections_name_the_field(request_: GenerateRequest, field: str) -> None:
    b = backend(max_model_len=64, num_kv_blocks=4)
    with pytest.raises(RequestRejected, match=field):
        b.add("x", request_)
    assert not b.has_work()


def test_duplicate_request_id_rejected_until_finished() -> None:
    b = backend()
    b.add("x", req(PROMPT, max_tokens=2))
    with pytest.raises(RequestRejected, match="request_id 'x'"):
        b.add("x", req(PROMPT))
    run(b)
    b.add("x", req(PROMPT))


def test_abort_frees_blocks_silently() -> None:
    b = backend()
    b.add("a", req(PROMPT, max_tokens=100))
    b.step()
    assert b.load().kv_usage > 0 and b.load().running == 1
    b.abort(["a", "never-added"])
    load = b.load()
    assert (load.running, load.waiting, load.kv_usage, b.has_work()) == (0, 0, 0.0, False)


def test_timing_model() -> None:
    b = backend(instant=False, prefill_tps=1000.0, decode_ms=10.0, decode_ms_per_seq=0.5)
    b.add("a", req(list(range(100))))
    assert b.step().duration_s == pytest.approx(0.1)  # prefill only: nothing decodes yet
    assert b.step().duration_s == pytest.approx(0.0105)  # one decoding sequence
    b.add("b", req(list(range(200, 250))))
    assert b.step().duration_s == pytest.approx(0.05 + 0.011)  # 50 prompt tokens + 2 in the batch
    fast = backend(instant=True)
    fast.add("a", req(list(range(100))))
    assert fast.step().duration_s == 0.0


def test_load_counts_running_and_waiting() -> None:
    b = backend(max_num_seqs=2)
    for i in range(3):
        b.add(f"r{i}", req(PROMPT, rid=f"r{i}"))
    assert (b.load().running, b.load().waiting) == (0, 3)
    b.step()
    assert (b.load().running, b.load().waiting) == (2, 1)


def test_lora_utilities(tmp_path: Path) -> None:
    b = backend()
    x, y, z = (str(fake_adapter(tmp_path, n)) for n in "xyz")
    assert b.utility("add_lora", {"name": "b", "path": x}) is True
    assert b.utility("add_lora", {"name": "a", "path": y}) is True
    assert b.utility("list_loras", {}) == ["a", "b"]
    assert b.utility("add_lora", {"name": "a", "path": y}) is False  # the same adapter again
    with pytest.raises(ValueError, match=f"already loaded from '{y}'"):
        b.utility("add_lora", {"name": "a", "path": z})
    assert run(b, req(PROMPT, lora="a"))["r"]["finish"] == "length"
    assert b.utility("remove_lora", {"name": "a"}) is True
    assert b.utility("remove_lora", {"name": "a"}) is False
    with pytest.raises(RequestRejected, match="lora 'a'"):
        b.add("r", req(PROMPT, lora="a"))
    with pytest.raises(ValueError, match="add_lora.path"):
        b.utility("add_lora", {"name": "c"})


def test_reset_prefix_cache_refused_while_running() -> None:
    b = backend()
    b.add("a", req(PROMPT, max_tokens=100))
    b.step()
    assert b.utility("reset_prefix_cache", {}) is False
    b.abort(["a"])
    assert b.utility("reset_prefix_cache", {}) is True
    assert b.has_work()  # the Cleared event still has to go out
    assert b.step().kv_events == [Cleared()]
    assert run(b, req(PROMPT))["r"]["cached"] == 0


def test_sleep_and_wake_up() -> None:
    b = backend()
    b.add("a", req(PROMPT))
    b.step()
    with pytest.raises(ValueError, match="sleep refused"):
        b.utility("sleep", {"level": 1})
    with pytest.raises(ValueError, match="sleep.level"):
        b.utility("sleep", {"level": 3})
    run(b)
    b.utility("sleep", {"level": 1})
    assert b.step().kv_events == [Cleared()]  # the KV cache is discarded
    b.add("b", req(PROMPT, rid="b"))
    assert not b.has_work()
    assert b.step().outputs == []
    b.utility("wake_up", {})
    assert run(b)["b"]["finish"] == "length"


@pytest.mark.parametrize("name", ["pause", "collective_rpc", "__init__", "shutdown"])
def test_other_utilities_unsupported(name: str) -> None:
    with pytest.raises(UtilityUnsupported, match=name):
        backend().utility(name, {})


def test_echo_replays_the_prompt_in_order() -> None:
    b = backend(echo=True)
    out = run(b, req([5, 6, 7], rid="e", max_tokens=7))
    assert out["e"]["tokens"] == [5, 6, 7, 5, 6, 7, 5]


# ---- scripted replies (--sim-script) ------------------------------------------------------------

REPLY = '<tool_call>\n{"name": "get_weather"}\n</tool_call>'


def chars(text: str) -> list[int]:  # a one-token-per-character tokenizer, ids inside VOCAB
    return [ord(c) for c in text]


def scripted(rules: list[tuple[str, str]], *, eos: int | None = EOS, **overrides: Any) -> SimBackend:
    script = Script([Rule(re.compile(m, re.DOTALL), r, tuple(chars(r))) for m, r in rules],
                    lambda ids: "".join(map(chr, ids)))
    config = SimConfig(**{"instant": True, **overrides})
    return SimBackend(config, model="sim-model", vocab_size=VOCAB, eos_token_id=eos, script=script)


def test_scripted_reply_one_token_per_step_then_eos_as_if_sampled() -> None:
    b = scripted([("weather", REPLY)])
    b.add("r", req(chars("what is the weather in Paris?"), max_tokens=100))
    steps = []
    while b.has_work():
        outs = b.step().outputs
        assert len(outs) == 1 and len(outs[0].new_token_ids) == 1
        steps.append((outs[0].new_token_ids[0], outs[0].finish_reason, outs[0].stop_reason))
    assert [t for t, _, _ in steps] == chars(REPLY) + [EOS]
    assert all(f is None for _, f, _ in steps[:-1]) and steps[-1] == (EOS, "stop", None)


def test_scripted_reply_cut_by_max_tokens_finishes_with_length() -> None:
    shorter = run(scripted([("weather", REPLY)]), req(chars("weather?"), max_tokens=5))["r"]
    assert (shorter["tokens"], shorter["finish"], shorter["stop"]) == (chars(REPLY)[:5], "length", None)
    # Room for the reply but not the EOS after it: "length", as a model that would say EOS next.
    exact = run(scripted([("weather", REPLY)]), req(chars("weather?"), max_tokens=len(REPLY)))["r"]
    assert (exact["tokens"], exact["finish"]) == (chars(REPLY), "length")


def test_scripted_reply_without_an_eos_token_stops_on_its_last_token() -> None:
    result = run(scripted([("weather", "sunny")], eos=None), req(chars("weather?")))["r"]
    assert (result["tokens"], result["finish"], result["stop"]) == (chars("sunny"), "stop", None)


def test_first_matching_rule_wins_and_other_prompts_sample_as_without_a_script() -> None:
    b = scripted([("weather", "one"), ("weather|time", "two")])
    prompt = chars("hello, nothing to match")
    out = run(b, req(chars("weather and time"), rid="a"), req(chars("time?"), rid="b"), req(prompt, rid="c"))
    assert out["a"]["tokens"] == chars("one") + [EOS]
    assert out["b"]["tokens"] == chars("two") + [EOS]
    assert out["c"]["tokens"] == run(backend(), req(prompt, rid="c"))["c"]["tokens"]  # seeded, unchanged
    assert out["c"]["finish"] == "length"


def test_scripted_reply_ignores_stop_ids_min_tokens_ignore_eos_and_eos_rate() -> None:
    b = scripted([("weather", "sunny")], eos_rate=1.0)
    sampling = {"stop_token_ids": [ord("n")], "min_tokens": 8, "ignore_eos": True, "max_tokens": 16}
    result = run(b, req(chars("weather?"), **sampling))["r"]
    assert (result["tokens"], result["finish"], result["stop"]) == (chars("sunny") + [EOS], "stop", None)


def test_scripted_reply_resumes_where_it_was_after_preemption() -> None:
    # 4 blocks of 4 tokens; each request grows to 11 tokens (3 blocks): one is preempted and recomputed.
    b = scripted([("w", "abcdefgh")], block_size=4, num_kv_blocks=4, max_model_len=16, max_num_seqs=2)
    out = run(b, req(chars("w1"), rid="x"), req(chars("w2"), rid="y"))
    assert out["x"]["tokens"] == out["y"]["tokens"] == chars("abcdefgh") + [EOS]


def _segments(b: SimBackend, r: GenerateRequest) -> list[tuple[Any, Any, Any]]:
    """Each output of `r` with its sampled and prompt logprob segments read back, laid end to end in
    one frame as the core loop lays them."""
    from protocol.logprobs import unpack

    b.add(r.request_id, r)
    got = []
    while b.has_work():
        result = b.step()
        for out in result.outputs:
            frame = b""
            for ref, parts in result.segments.get(out.request_id, []):
                ref.offset = len(frame)
                frame += b"".join(parts)
            got.append((out, None if out.packed_logprobs is None else unpack([frame], out.packed_logprobs),
                        None if out.packed_prompt_logprobs is None else unpack([frame], out.packed_prompt_logprobs)))
    return got


def test_logprobs_follow_the_fixed_fake_distribution() -> None:
    import math

    got = _segments(backend(), req(PROMPT, max_tokens=6, logprobs=3))
    assert len(got) == 6
    for out, seg, prompt in got:
        assert prompt is None and seg is not None and (seg.positions, seg.k) == (1, 3)
        token = out.new_token_ids[0]
        rank = 1 + token % 4
        assert seg.token_ids[0] == token and seg.ranks[0] == rank
        assert math.isclose(seg.logprobs[0], -rank * math.log(2), rel_tol=1e-6)
        tops = list(seg.token_ids[1:])
        assert len(set(tops)) == 3 and (token in tops) == (rank <= 3)
        if rank <= 3:
            assert tops[rank - 1] == token and seg.logprobs[rank] == seg.logprobs[0]
        assert list(seg.logprobs[1:]) == sorted(seg.logprobs[1:], reverse=True)


def test_prompt_logprobs_come_once_with_the_first_token_for_the_prompt_after_its_first() -> None:
    got = _segments(backend(), req(PROMPT, max_tokens=3, prompt_logprobs=2))
    first, *rest = got
    assert first[1] is None and all(p is None and s is None for _, s, p in rest)
    prompt = first[2]
    assert (prompt.positions, prompt.k) == (len(PROMPT) - 1, 2)
    assert [prompt.token_ids[i * 3] for i in range(prompt.positions)] == PROMPT[1:]
    assert list(prompt.ranks) == [1 + t % 4 for t in PROMPT[1:]]
    # The same token gets the same row as a generated one would.
    one = _segments(backend(), req([7, PROMPT[5]], max_tokens=1, prompt_logprobs=2))[0][2]
    assert list(one.token_ids) == list(prompt.token_ids[4 * 3:5 * 3])
    assert list(one.logprobs) == list(prompt.logprobs[4 * 3:5 * 3])


def test_no_logprobs_no_segments() -> None:
    b = backend()
    b.add("r", req(PROMPT, max_tokens=2))
    while b.has_work():
        result = b.step()
        assert result.segments == {} and all(o.packed_logprobs is None for o in result.outputs)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_timings_come_with_the_first_token_and_the_finish_on_the_timing_model() -> None:
    clock = _Clock()
    config = SimConfig(prefill_tps=1000.0, decode_ms=10.0, decode_ms_per_seq=0.0)
    b = SimBackend(config, model="m", vocab_size=VOCAB, eos_token_id=EOS, clock=clock)
    b.add("a", req(list(range(100)), max_tokens=3))  # queued at 0
    clock.now = 1.0  # the core loop was busy: scheduled 1 s later
    outputs = []
    while b.has_work():
        result = b.step()
        clock.now += result.duration_s  # the core loop delivers when the step's time is up
        outputs += result.outputs
    assert [o.timings is not None for o in outputs] == [True, False, True]
    first, last = outputs[0].timings, outputs[-1].timings
    assert first is not None and last is not None
    assert (first.queued_time, first.prefill_time, first.decode_time) == pytest.approx((1.0, 0.1, 0.0))
    assert (last.queued_time, last.prefill_time, last.decode_time) == pytest.approx((1.0, 0.1, 0.02))
    assert (first.num_preemptions, last.num_preemptions) == (0, 0)


def test_iteration_tokens_count_computed_prompt_tokens_with_the_first_token_as_vllm() -> None:
    b = backend()
    b.add("a", req(PROMPT, rid="a", max_tokens=2))
    assert b.step().num_tokens == 40 + 1
    assert b.step().num_tokens == 1
    b.add("b", req(PROMPT, rid="b", max_tokens=1))  # 32 of its 40 tokens are cached (2 full blocks)
    assert b.step().num_tokens == 8 + 1


def test_preemption_under_kv_pressure_is_counted_and_inside_the_timings() -> None:
    """Three requests that outgrow a small pool: some are preempted and recomputed. Each one's phases
    still add up to its time from queued to finished, its queue time ends at its first scheduling
    (its first-token and final timings agree on it), and the counts agree with Load."""
    clock = _Clock()
    config = SimConfig(block_size=4, num_kv_blocks=6, max_model_len=24, max_num_seqs=3, max_num_batched_tokens=8,
                       prefill_tps=100.0, decode_ms=10.0)
    b = SimBackend(config, model="m", vocab_size=VOCAB, eos_token_id=EOS, clock=clock)
    for i in range(3):
        b.add(f"r{i}", req([10 * i + 1] * 4, rid=f"r{i}", max_tokens=12, ignore_eos=True))
        clock.now += 0.5
    timings: dict[str, list[Any]] = {}
    finished_at = {}
    while b.has_work():
        result = b.step()
        clock.now += result.duration_s
        for out in result.outputs:
            if out.timings is not None:
                timings.setdefault(out.request_id, []).append(out.timings)
            if out.finish_reason is not None:
                finished_at[out.request_id] = clock.now
    assert b.load().num_preemptions > 0
    assert sum(t[-1].num_preemptions for t in timings.values()) == b.load().num_preemptions
    for i, rid in enumerate(sorted(timings)):
        first, last = timings[rid]
        assert first.queued_time == last.queued_time >= 0 and first.prefill_time == last.prefill_time > 0
        assert first.decode_time == 0 and last.decode_time > 0
        total = last.queued_time + last.prefill_time + last.decode_time
        assert total == pytest.approx(finished_at[rid] - 0.5 * i)


@pytest.mark.parametrize("kind", ["missing", "file", "url", "directory without adapter_config.json"])
def test_add_lora_refuses_what_is_not_an_adapter_directory(tmp_path: Path, kind: str) -> None:
    b = backend()
    (tmp_path / "weights.safetensors").write_bytes(b"")
    path = {"missing": str(tmp_path / "nope"), "file": str(tmp_path / "weights.safetensors"),
            "url": "https://example.com/adapter", "directory without adapter_config.json": str(tmp_path)}[kind]
    with pytest.raises(ValueError, match=re.escape(f"add_lora.path {path!r}: no adapter_config.json there")):
        b.utility("add_lora", {"name": "a", "path": path})
    assert b.utility("list_loras", {}) == []
