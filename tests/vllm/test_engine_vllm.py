"""Our engine with the real vLLM backend on CPU and the tiny model, over tcp loopback: token parity
with vLLM's own offline LLM.generate (plain, with logits controls, with structured outputs), packed
logprobs equal to vLLM's (also under a constraint), abort, prefix-cache reporting with KV events, two
ranks, a grammar vLLM cannot use refused as invalid."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from protocol import BlockStored, Outputs, Ready, decode
from protocol.block_hash import block_hashes
from tests.support.engine_client import EngineClient, wait_subscribed
from tests.support.procs import EngineProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPTS = [
    [151644, 872, 198, 9707, 11, 879, 525, 498, 30, 151645, 198, 151644, 77091, 198],
    [785, 6722, 315, 9625, 374],
    list(range(2000, 2300)),  # 300 tokens: two full blocks of 128 on CPU
]


@pytest.fixture(scope="module")
def engine(vllm_engine: EngineProc) -> EngineProc:
    """Two vLLM ranks from one command (tests/vllm/conftest.py: shared with the frontend tests)."""
    return vllm_engine


@pytest.fixture
def client(engine: EngineProc) -> Iterator[EngineClient]:
    c = EngineClient(engine.endpoint(0))
    ready = c.handshake(timeout_s=60)
    assert isinstance(ready, Ready) and ready.backend == "vllm", ready
    yield c
    c.close()


def test_two_ranks_start_from_one_command(engine: EngineProc) -> None:
    for rank in (0, 1):
        c = EngineClient(engine.endpoint(rank))
        try:
            ready = c.handshake(timeout_s=60)
            assert isinstance(ready, Ready) and ready.rank == rank and ready.backend == "vllm"
            assert ready.max_model_len == 1024 and ready.num_kv_blocks > 0
            assert (ready.runner, ready.tasks) == ("generate", ["generate"])  # protocol 1.5, from vLLM's core
            c.generate("hi", PROMPTS[1], max_tokens=4, temperature=0.0)
            assert c.collect(["hi"], 120)["hi"].finish_reason == "length"
        finally:
            c.close()


def test_greedy_tokens_equal_vllm_offline_generate(client: EngineClient, llm: Any) -> None:
    from vllm import SamplingParams

    for i, prompt in enumerate(PROMPTS):
        client.generate(f"p{i}", prompt, max_tokens=32, temperature=0.0)
    ours = client.collect([f"p{i}" for i in range(len(PROMPTS))], 120)
    reference = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                             SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    for i, ref in enumerate(reference):
        assert ours[f"p{i}"].token_ids == list(ref.outputs[0].token_ids), f"prompt {i} diverged"
        assert ours[f"p{i}"].finish_reason == "length"


def test_abort_stops_a_request(client: EngineClient) -> None:
    client.generate("long", PROMPTS[0], max_tokens=900, temperature=0.0)
    first = client.recv(120)
    assert isinstance(first, Outputs) and first.outputs[0].request_id == "long"
    client.abort("long")
    result = client.collect(["long"], 60)["long"]
    assert result.finish_reason == "abort"
    assert len(result.token_ids) + len(first.outputs[0].new_token_ids) < 900
    stats = client.utility("stats", 30)
    assert stats.ok and stats.result["running"] == 0 and stats.result["in_flight"] == 0


def test_prefix_cache_hit_reported_with_protocol_block_hashes(client: EngineClient, engine: EngineProc) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(engine.pub_endpoint(0))
    try:
        wait_subscribed(sub)  # let the subscription reach the publisher
        prompt = list(range(5000, 5300))
        client.generate("c1", prompt, max_tokens=2, temperature=0.0)
        assert client.collect(["c1"], 120)["c1"].num_cached_tokens == 0
        client.generate("c2", prompt, max_tokens=2, temperature=0.0)
        assert client.collect(["c2"], 120)["c2"].num_cached_tokens == 256
        expected = block_hashes(prompt, 128)
        stored: list[int] = []
        deadline = time.monotonic() + 10
        while not set(expected) <= set(stored) and time.monotonic() < deadline:
            if sub.poll(100):
                msg = decode(sub.recv_multipart())
                if isinstance(msg, BlockStored):
                    stored += msg.block_hashes
        assert set(expected) <= set(stored), "KV events did not carry protocol.block_hash values"
    finally:
        sub.close()


def _close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-4


def test_packed_logprobs_equal_vllm_offline_generate(client: EngineClient, llm: Any) -> None:
    """The engine's packed arrays against vLLM's own logprobs for the same greedy requests: the sampled
    token's logprob and rank, the top-5 ids and logprobs, and the prompt's top-3 with ranks."""
    from vllm import SamplingParams

    prompts = PROMPTS[:2]
    for i, prompt in enumerate(prompts):
        client.generate(f"lp{i}", prompt, max_tokens=8, temperature=0.0, logprobs=5, prompt_logprobs=3)
    ours = client.collect([f"lp{i}" for i in range(len(prompts))], 120)
    refs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=8, logprobs=5, prompt_logprobs=3), use_tqdm=False)
    for i, ref in enumerate(refs):
        got, out = ours[f"lp{i}"], ref.outputs[0]
        assert got.token_ids == list(out.token_ids)
        for rows, tokens, expected, k in ((got.logprobs, out.token_ids, out.logprobs, 5),
                                          (got.prompt_logprobs, prompts[i][1:], ref.prompt_logprobs[1:], 3)):
            assert len(rows) == len(tokens) == len(expected)
            for (ids, lps, rank), tid, want in zip(rows, tokens, expected, strict=True):
                assert ids[0] == tid and rank == want[tid].rank and _close(lps[0], want[tid].logprob)
                tops = {t: lp.logprob for t, lp in want.items() if lp.rank <= k}
                assert len(ids) == k + 1 and set(ids[1:]) == set(tops)
                assert all(_close(lp, tops[t]) for t, lp in zip(ids[1:], lps[1:], strict=True))
                assert [want[t].rank for t in ids[1:]] == list(range(1, k + 1))
def _reference(llm: Any, prompt: list[int], **sampling: Any) -> list[int]:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, **sampling), use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def test_logits_controls_equal_vllm_offline_generate(client: EngineClient, llm: Any) -> None:
    from services.frontend.model import Model

    tokenizer = Model.load("tiny", "tiny").tokenizer
    prompt = PROMPTS[1]
    baseline = _reference(llm, prompt, max_tokens=16)
    # A baseline token that is a whole word, so that vLLM's bad-word tokenization (with and without a
    # leading space) yields it.
    word_id = next(t for t in baseline if tokenizer.decode([t]).strip().isalpha())
    word = tokenizer.decode([word_id]).strip()
    favourite = 9707
    cases: dict[str, dict[str, Any]] = {
        "bias": {"logit_bias": {favourite: 100.0}},
        "allowed": {"allowed_token_ids": [11, 13, 9707]},
        "bad": {"bad_words": [word]},
    }
    for name, sampling in cases.items():
        client.generate(name, prompt, max_tokens=16, temperature=0.0, **sampling)
    ours = client.collect(list(cases), 120)
    assert ours["bias"].token_ids == [favourite] * 16
    assert set(ours["allowed"].token_ids) <= {11, 13, 9707}
    assert word_id in baseline and word_id not in ours["bad"].token_ids
    for name, sampling in cases.items():
        assert ours[name].token_ids == _reference(llm, prompt, max_tokens=16, **sampling), name


def test_structured_outputs_equal_vllm_offline_generate(client: EngineClient, llm: Any) -> None:
    import re

    from vllm.sampling_params import StructuredOutputsParams

    from services.frontend.model import Model

    tokenizer = Model.load("tiny", "tiny").tokenizer
    regex = r"[a-z]{3,8}-[0-9]{2}"
    cases: dict[str, dict[str, Any]] = {"regex": {"regex": regex}, "choice": {"choice": ["yes", "no", "maybe"]},
                                        "grammar": {"grammar": 'root ::= "The answer is " ("yes" | "no") "."'}}
    for name, constraint in cases.items():
        client.generate(name, PROMPTS[1], max_tokens=40, temperature=0.0, **constraint)
    ours = client.collect(list(cases), 120)
    text = {name: tokenizer.decode([t for t in r.token_ids if t < 151643]) for name, r in ours.items()}
    assert re.fullmatch(regex, text["regex"]), text
    assert text["choice"] in ("yes", "no", "maybe") and text["grammar"] in ("The answer is yes.", "The answer is no.")
    for name, constraint in cases.items():
        assert ours[name].finish_reason == "stop", name
        reference = _reference(llm, PROMPTS[1], max_tokens=40,
                               structured_outputs=StructuredOutputsParams(**constraint))
        assert ours[name].token_ids == reference, name


def test_logprobs_of_a_constrained_request_equal_vllm_offline_generate(client: EngineClient, llm: Any) -> None:
    """Both MINOR 3 additions in one request: a regex and a logit bias with logprobs and prompt_logprobs,
    the packed arrays against vLLM's own for the same request."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompt, regex = PROMPTS[1], r"[a-z]{3,8}"
    client.generate("both", prompt, max_tokens=12, temperature=0.0, regex=regex, logit_bias={11: -5.0},
                    logprobs=3, prompt_logprobs=2)
    got = client.collect(["both"], 120)["both"]
    ref = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2,
                                      logit_bias={11: -5.0}, structured_outputs=StructuredOutputsParams(regex=regex)),
                       use_tqdm=False)[0]
    out = ref.outputs[0]
    assert got.token_ids == list(out.token_ids) and got.finish_reason == "stop"
    for rows, tokens, expected in ((got.logprobs, out.token_ids, out.logprobs),
                                   (got.prompt_logprobs, prompt[1:], ref.prompt_logprobs[1:])):
        assert len(rows) == len(tokens) == len(expected)
        for (ids, lps, rank), tid, want in zip(rows, tokens, expected, strict=True):
            assert ids[0] == tid and _close(lps[0], want[tid].logprob)
            # The rank is vLLM's array's, which counts the tokens at least as likely: where the grammar
            # leaves two stop tokens tied, 2 for either, where the offline dict keeps the top-k's 1.
            assert rank in (want[tid].rank, sum(lp >= lps[0] for lp in lps[1:])), (rank, want)


@pytest.mark.parametrize(("sampling", "field", "needle"), [
    ({"grammar": "root ::= ("}, "grammar", "Invalid grammar specification."),
    ({"regex": "(a"}, "regex", "Failed to transform regex into a grammar"),
    ({"json_schema": '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}'}, "json_schema",
     "Cannot find field nowhere"),
])
def test_what_vllm_cannot_use_is_refused_as_the_requests_fault(client: EngineClient, sampling: dict[str, Any],
                                                               field: str, needle: str) -> None:
    client.generate("bad", PROMPTS[1], max_tokens=4, temperature=0.0, **sampling)
    result = client.collect(["bad"], 60)["bad"]
    assert result.finish_reason == "error" and result.error_kind == "invalid", result
    assert result.error is not None and result.error.startswith(f"sampling.{field}: ") and needle in result.error
    # The rank is unharmed: the next request is served.
    client.generate("after", PROMPTS[1], max_tokens=2, temperature=0.0)
    assert client.collect(["after"], 60)["after"].finish_reason == "length"
