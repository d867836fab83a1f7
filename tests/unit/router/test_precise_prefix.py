"""The precise_prefix policy's choice from what each replica's engines hold (no gRPC here: the
blocks are filled directly; tests/unit/router/test_kv_events.py feeds them over a stream)."""
from __future__ import annotations

import asyncio

import pytest

from protocol.block_hash import block_hashes
from services.router.backends.policies import Policy, build_policy
from services.router.backends.policies.precise_prefix import INLINE_BYTES, PrecisePrefix, Prompt
from services.router.backends.pool import Lease, Pool
from services.router.backends.prompt_ids import PromptModel
from services.router.backends.replica import Replica
from services.router.config import parse_config

STALE = " (its KvEvents stream is down: what it holds may be stale)"
HASHES = tuple(block_hashes(list(range(160)), 16))  # ten blocks


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _replicas(n: int) -> list[Replica]:
    return [Replica(f"http://r{i}", last_assigned=i) for i in range(n)]


def _live(policy: PrecisePrefix, rs: list[Replica]) -> None:
    for r in rs:
        policy.blocks(r.url).connected = True  # as while its stream is open


def test_the_replica_holding_the_longest_prefix_wins() -> None:
    policy, rs = PrecisePrefix(), _replicas(3)
    policy.blocks("http://r1").stored(0, "e", HASHES[:6])
    policy.blocks("http://r2").stored(0, "e", HASHES[:9])
    _live(policy, rs)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[2]
    assert policy.last_reason == "precise_prefix: 9/10 blocks (0.90) held on rank 0 > 0.50 -> http://r2"
    assert policy.last_match == 0.9


def test_only_a_leading_run_on_one_rank_counts() -> None:
    policy, rs = PrecisePrefix(cache_threshold=0.3), _replicas(2)
    held = policy.blocks("http://r0")
    held.stored(0, "e", HASHES[:3])  # rank 0: the first 3
    held.stored(1, "e", HASHES[3:])  # rank 1: the rest, useless without the first ones on the same rank
    policy.blocks("http://r1").stored(2, "e", HASHES[:4] + HASHES[5:])  # a hole after 4
    _live(policy, rs)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[1]
    assert "4/10 blocks (0.40) held on rank 2" in policy.last_reason


def test_a_weak_match_goes_to_the_replica_holding_fewest_blocks_then_the_least_loaded() -> None:
    policy, rs = PrecisePrefix(), _replicas(4)
    policy.blocks("http://r0").stored(0, "e", HASHES[:2] + (1, 2, 3))
    policy.blocks("http://r1").stored(0, "e", (4, 5, 6, 7, 8, 9))
    policy.blocks("http://r2").stored(0, "e", (10, 11))
    policy.blocks("http://r3").stored(0, "e", (12, 13))
    rs[2].inflight = 1
    _live(policy, rs)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[3]
    assert policy.last_reason == ("precise_prefix: best 2/10 blocks (0.20) <= 0.50 -> fewest blocks held or sent "
                                  "http://r3 (2)")
    policy.on_assigned(rs[3], None, Prompt(HASHES[5:]))  # five blocks sent there: 7 held or sent
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[2]


def test_a_prompt_just_sent_counts_as_held_there_until_it_expires() -> None:
    clock = Clock()
    policy, rs = PrecisePrefix(pending_s=5.0, clock=clock), _replicas(3)
    _live(policy, rs)
    rs[0].inflight = rs[1].inflight = 1
    first = policy.choose(rs, 100, None, Prompt(HASHES))
    assert first is rs[2]
    policy.on_assigned(first, None, Prompt(HASHES))
    rs[2].inflight = 2  # the first is running there: its blocks are not reported yet
    clock.t = 4.0
    assert policy.choose(rs, 100, None, Prompt(HASHES[:8] + (77, 78))) is rs[2]
    assert policy.last_reason == ("precise_prefix: 8/10 blocks (0.80) sent there, not reported yet > 0.50 "
                                  "-> http://r2")
    clock.t = 5.0  # not reported in time (the request failed, or its blocks were evicted at once)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[0]
    assert policy.last_reason.startswith("precise_prefix: best 0/10 blocks")


def test_what_the_engine_reports_wins_over_what_was_sent() -> None:
    clock = Clock()
    policy, rs = PrecisePrefix(clock=clock), _replicas(2)
    _live(policy, rs)
    policy.on_assigned(rs[0], None, Prompt(HASHES))
    policy.blocks("http://r0").stored(0, "e", HASHES)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[0]
    assert "10/10 blocks (1.00) held on rank 0" in policy.last_reason


def test_imbalance_goes_to_the_least_loaded_before_any_match() -> None:
    policy, rs = PrecisePrefix(balance_abs=4, balance_rel=1.5), _replicas(2)
    policy.blocks("http://r0").stored(0, "e", HASHES)
    rs[0].inflight, rs[1].inflight = 10, 1
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[1]
    assert policy.last_reason == "precise_prefix: imbalanced (in-flight max 10, min 1) -> least loaded http://r1"


def test_without_hashes_it_says_why_and_goes_by_load() -> None:
    policy, rs = PrecisePrefix(), _replicas(2)
    rs[0].inflight = 1
    assert policy.choose(rs, 100, None, Prompt(tokens=7, reason="7 tokens: no full block")) is rs[1]
    assert policy.last_reason == "precise_prefix: 7 tokens: no full block -> least loaded http://r1"
    assert policy.choose(rs, 100, None) is rs[1]
    assert policy.last_reason == "precise_prefix: nothing prepared -> least loaded http://r1"


def test_a_replica_with_another_tokenizer_is_not_scored() -> None:
    policy, rs = PrecisePrefix(), _replicas(2)
    policy.blocks("http://r0").stored(0, "e", HASHES)
    policy.blocks("http://r0").mismatch = "its tokenizer.json differs"
    policy.blocks("http://r1").stored(0, "e", HASHES[:7])
    policy.blocks("http://r1").connected = True
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[1]
    assert policy.last_reason.endswith("-> http://r1")


def test_a_cleared_rank_holds_nothing_and_a_stale_stream_is_said() -> None:
    policy, rs = PrecisePrefix(), _replicas(2)
    held = policy.blocks("http://r0")
    held.stored(0, "e1", HASHES)
    held.stored(1, "e1", HASHES[:6])
    held.cleared(0, "e2")  # rank 0's engine restarted
    assert held.match(list(HASHES)) == (6, 1)
    assert policy.choose(rs, 100, None, Prompt(HASHES)) is rs[0]
    assert policy.last_reason.endswith("(its KvEvents stream is down: what it holds may be stale)")


def test_a_new_epoch_without_cleared_starts_the_rank_empty() -> None:
    policy = PrecisePrefix()
    held = policy.blocks("http://r0")
    held.stored(0, "e1", HASHES)
    held.stored(0, "e2", HASHES[:1])
    assert held.match(list(HASHES)) == (1, 0)
    held.removed(0, "e2", HASHES[:1])
    assert held.match(list(HASHES)) == (0, -1)


def test_prepare_hashes_as_the_engines_do() -> None:
    policy = PrecisePrefix()
    body = {"prompt": list(range(40))}
    assert asyncio.run(policy.prepare(body, 100)) == Prompt(reason="no tokenizer loaded")
    policy.model = PromptModel.load("tiny")
    assert asyncio.run(policy.prepare(body, 100)).reason.startswith("block size not known yet")
    policy.learn_block_size(16, "test")
    assert asyncio.run(policy.prepare(body, 100)) == Prompt(tuple(block_hashes(list(range(40)), 16)), 40)
    assert asyncio.run(policy.prepare({"prompt": [1, 2]}, 10)) == Prompt(tokens=2, reason="2 tokens: no full block")
    assert asyncio.run(policy.prepare({"messages": []}, 10)).reason.startswith("not tokenized: chat template")


def test_a_pool_whose_model_is_not_the_base_models_hashes_as_its_lora_adapter() -> None:
    policy = PrecisePrefix()
    policy.model = PromptModel.load("tiny")
    policy.learn_block_size(16, "test")
    body = {"prompt": list(range(40))}
    plain = tuple(block_hashes(list(range(40)), 16))
    policy.upstream_model = "ad"
    assert asyncio.run(policy.prepare(body, 100)).hashes == plain  # the replicas' base model not known yet
    policy.learn_served_model("tiny", "test")
    assert policy.lora == "ad"
    assert asyncio.run(policy.prepare(body, 100)).hashes == tuple(block_hashes(list(range(40)), 16, lora="ad"))
    policy.upstream_model = "tiny"
    assert policy.lora is None and asyncio.run(policy.prepare(body, 100)).hashes == plain


def test_the_pool_passes_what_was_prepared() -> None:
    config = parse_config({
        "listeners": [{"port": 8080}],
        "pools": {"p": {"model": "m", "tokenizer": "tiny", "policy": "precise_prefix",
                        "precise_prefix": {"cache_threshold": 0.2},
                        "replicas": [{"url": "http://a:1", "grpc": "a:2"}, {"url": "http://b:1", "grpc": "b:2"}]}},
        "entries": {"e": {"default": ["p"]}}})
    policy = build_policy(config.pools["p"])
    assert isinstance(policy, PrecisePrefix) and policy.cache_threshold == 0.2
    pool = Pool("p", ["http://a:1", "http://b:1"], policy=policy)
    policy.blocks("http://b:1").stored(0, "e", HASHES[:5])
    picked = pool.preview(10, prepared=Prompt(HASHES))
    assert isinstance(picked, Replica) and picked.url == "http://b:1"
    lease = pool.acquire(10, prepared=Prompt(HASHES))
    assert isinstance(lease, Lease) and lease.replica is picked
    assert lease.reason == "precise_prefix: 5/10 blocks (0.50) held on rank 0 > 0.20 -> http://b:1" + STALE


@pytest.mark.parametrize("name", ["least_outstanding", "cache_aware", "round_robin"])
def test_the_other_policies_prepare_nothing(name: str) -> None:
    config = parse_config({"listeners": [{"port": 8080}],
                           "pools": {"p": {"model": "m", "policy": name, "replicas": [{"url": "http://a:1"}]}},
                           "entries": {"e": {"default": ["p"]}}})
    policy: Policy = build_policy(config.pools["p"])
    assert asyncio.run(policy.prepare({"prompt": "x"}, 1)) is None


def test_a_long_body_is_tokenized_off_the_loop() -> None:
    policy = PrecisePrefix()
    model = policy.model = PromptModel.load("tiny")
    policy.learn_block_size(16, "test")
    text = "word " * INLINE_BYTES
    body = {"messages": [{"role": "user", "content": text}]}

    async def main() -> tuple[Prompt, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        task = asyncio.create_task(ticker())
        prompt = await policy.prepare(body, len(text))
        task.cancel()
        return prompt, ticks

    prompt, ticks = asyncio.run(main())
    ids = model.prompt_now(body).ids
    assert prompt == Prompt(tuple(block_hashes(ids, 16)), len(ids))
    assert ticks > 0  # the loop ran other work while the prompt was made
