"""The sim engine's pooling runner: deterministic pooled outputs from token ids, shaped and activated as
vLLM's poolers, through the scheduler like any prompt; and which runner and tasks a checkpoint gets."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from protocol import GenerateRequest, PoolingParams, SamplingParams
from protocol.pooled import unpack
from services.engine.backend import RequestRejected, StepResult
from services.engine.backends.sim import SimBackend, SimConfig
from services.engine.backends.sim.pooler import SimPooler
from services.engine.backends.sim.runner import CLASSIFY_TASKS, EMBED_TASKS, resolve
from services.engine.config import EngineConfig
from services.engine.wiring import build_backend

VOCAB = 1000
HIDDEN = 48
LABELS = 3
REPO = Path(__file__).resolve().parents[4]
# A backend built here directly serves every task, so one backend covers the pooler's outputs.
ALL_POOLING_TASKS = EMBED_TASKS + CLASSIFY_TASKS


def pooling_backend(*, labels: int = LABELS, matryoshka: bool = False, **overrides: Any) -> SimBackend:
    pooler = SimPooler(model="sim-pool", hidden_size=HIDDEN, num_labels=labels, matryoshka=matryoshka)
    return SimBackend(SimConfig(**{"instant": True, "max_model_len": 64, **overrides}), model="sim-pool",
                      vocab_size=VOCAB, eos_token_id=None, pooler=pooler, tasks=ALL_POOLING_TASKS)


def pool_req(rid: str, prompt: list[int], task: str, **params: Any) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=1), 0.0, pooling=PoolingParams(task, **params))


def run(b: SimBackend, *requests: GenerateRequest) -> tuple[dict[str, Any], list[StepResult]]:
    """Step until idle: per request its values (a flat list) and shape; and the steps."""
    for r in requests:
        b.add(r.request_id, r)
    got: dict[str, Any] = {}
    steps = []
    while b.has_work():
        result = b.step()
        steps.append(result)
        for out in result.outputs:
            assert out.finish_reason == "stop" and out.new_token_ids == [] and out.pooled is not None
            ref, data = result.pooled[out.request_id]
            assert ref is out.pooled
            got[out.request_id] = (list(unpack([data], ref)), list(ref.shape))
    return got, steps


def test_embed_is_a_unit_vector_of_hidden_size_and_the_same_for_the_same_ids() -> None:
    got, _ = run(pooling_backend(), pool_req("a", [5, 6, 7], "embed"), pool_req("b", [5, 6, 8], "embed"))
    again, _ = run(pooling_backend(), pool_req("a", [5, 6, 7], "embed"))
    (a, shape), (b, _) = got["a"], got["b"]
    assert shape == [HIDDEN]
    assert math.isclose(math.fsum(v * v for v in a), 1.0, rel_tol=1e-5)
    assert again["a"] == got["a"]  # a new engine, the same vector
    assert a != b


def test_the_same_ids_give_the_same_vector_in_another_process() -> None:
    """No hash() seeds and no PRNG state: what a routing test relies on across engine restarts."""
    code = ("from tests.unit.engine.sim.test_pooling import pooling_backend, pool_req, run; "
            "print(run(pooling_backend(), pool_req('a', [5, 6, 7], 'embed'))[0]['a'][0][:4])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO), "PYTHONHASHSEED": "123"})
    here, _ = run(pooling_backend(), pool_req("a", [5, 6, 7], "embed"))
    assert out.stdout.strip() == str(here["a"][0][:4])


def test_use_activation_false_gives_the_raw_values() -> None:
    got, _ = run(pooling_backend(), pool_req("raw", [1, 2, 3], "embed", use_activation=False),
                 pool_req("norm", [1, 2, 3], "embed"))
    raw, norm = got["raw"][0], got["norm"][0]
    length = math.sqrt(math.fsum(v * v for v in raw))
    assert not math.isclose(length, 1.0, rel_tol=1e-3)
    assert raw == pytest.approx([v * length for v in norm], rel=1e-5)


def test_classify_is_a_softmax_over_the_labels_and_a_pair_split_changes_it() -> None:
    got, _ = run(pooling_backend(), pool_req("one", [1, 2, 3, 4], "classify"),
                 pool_req("pair", [1, 2, 3, 4], "classify", token_type_split=2),
                 pool_req("raw", [1, 2, 3, 4], "classify", use_activation=False))
    probs, shape = got["one"]
    assert shape == [LABELS] and math.isclose(sum(probs), 1.0, rel_tol=1e-5) and all(0 < p < 1 for p in probs)
    assert got["pair"][0] != probs
    raw = got["raw"][0]
    exps = [math.exp(v) for v in raw]
    assert probs == pytest.approx([e / sum(exps) for e in exps], rel=1e-5)


def test_one_label_is_a_sigmoid_score() -> None:
    got, _ = run(pooling_backend(labels=1), pool_req("s", [1, 2, 3], "classify", token_type_split=1),
                 pool_req("raw", [1, 2, 3], "classify", token_type_split=1, use_activation=False))
    (score,), (logit,) = got["s"][0], got["raw"][0]
    assert score == pytest.approx(1 / (1 + math.exp(-logit)), rel=1e-5)


def test_token_tasks_give_one_row_per_token() -> None:
    got, _ = run(pooling_backend(), pool_req("te", [1, 2, 3, 4, 5], "token_embed"),
                 pool_req("tc", [1, 2, 3, 4, 5], "token_classify"))
    values, shape = got["te"]
    assert shape == [5, HIDDEN]
    rows = [values[i * HIDDEN:(i + 1) * HIDDEN] for i in range(5)]
    assert all(math.isclose(math.fsum(v * v for v in row), 1.0, rel_tol=1e-5) for row in rows)
    values, shape = got["tc"]
    assert shape == [5, LABELS]
    assert all(math.isclose(sum(values[i * LABELS:(i + 1) * LABELS]), 1.0, rel_tol=1e-5) for i in range(5))


def test_dimensions_refused_on_a_model_without_matryoshka_as_vllm_refuses() -> None:
    with pytest.raises(RequestRejected, match=r"does not support Matryoshka embeddings; dimensions must be unset"):
        pooling_backend().add("d", pool_req("d", [1, 2], "embed", dimensions=8))


def test_dimensions_truncate_before_normalizing_on_a_matryoshka_model() -> None:
    got, _ = run(pooling_backend(matryoshka=True), pool_req("d", [1, 2, 3], "embed", dimensions=8),
                 pool_req("raw", [1, 2, 3], "embed", use_activation=False))
    short, shape = got["d"]
    assert shape == [8] and math.isclose(math.fsum(v * v for v in short), 1.0, rel_tol=1e-5)
    head = got["raw"][0][:8]
    norm = math.sqrt(math.fsum(v * v for v in head))
    assert short == pytest.approx([v / norm for v in head], rel=1e-5)
    with pytest.raises(RequestRejected, match=r"only supports dimensions in range \[1, 48\], got 49"):
        pooling_backend(matryoshka=True).add("x", pool_req("x", [1], "embed", dimensions=HIDDEN + 1))


def test_generation_on_a_pooling_engine_and_pooling_on_a_generating_one_are_refused() -> None:
    with pytest.raises(RequestRejected, match=r"task 'generate' is not served.*'embed'"):
        pooling_backend().add("g", GenerateRequest("g", [1, 2], SamplingParams(max_tokens=4), 0.0))
    generating = SimBackend(SimConfig(instant=True), model="m", vocab_size=VOCAB, eos_token_id=None)
    assert (generating.info.runner, generating.info.tasks) == ("generate", ("generate",))
    with pytest.raises(RequestRejected, match=r"task 'embed' is not served.*\['generate'\]"):
        generating.add("p", pool_req("p", [1, 2], "embed"))


def test_a_pooling_prompt_may_fill_the_context_but_not_pass_it() -> None:
    b = pooling_backend(max_model_len=16)
    got, _ = run(b, pool_req("full", list(range(1, 17)), "embed"))
    assert got["full"][1] == [HIDDEN]
    with pytest.raises(RequestRejected, match=r"17 tokens; must be <= max_model_len \(16\)"):
        b.add("long", pool_req("long", list(range(1, 18)), "embed"))


def test_pooling_prompts_take_the_prefill_budget_and_time_like_any_prompt() -> None:
    """Two 48-token prompts with a 64-token step budget: the second is chunked into the next step, and a
    timed sim charges the prefill rate for them."""
    b = pooling_backend(instant=False, max_num_batched_tokens=64, max_num_seqs=64, prefill_tps=1000.0)
    got, steps = run(b, pool_req("a", list(range(1, 49)), "embed"), pool_req("b", list(range(100, 148)), "embed"))
    assert [[o.request_id for o in s.outputs] for s in steps] == [["a"], ["b"]]
    assert [s.duration_s for s in steps] == pytest.approx([0.064, 0.032])
    assert [s.num_tokens for s in steps] == [48, 48]  # prompt tokens computed; none generated


def test_embed_reads_the_prefix_cache_and_per_token_tasks_do_not() -> None:
    b = pooling_backend()
    prompt = list(range(1, 40))
    run(b, pool_req("warm", prompt, "embed"))
    b.add("e", pool_req("e", prompt, "embed"))
    b.add("t", pool_req("t", prompt, "token_embed"))
    cached = {o.request_id: o.num_cached_tokens for o in b.step().outputs}
    assert cached == {"e": 32, "t": 0}


# ---- which runner and tasks --------------------------------------------------------------------


def test_runner_and_tasks_from_the_flags_and_the_checkpoint(tmp_path: Path) -> None:
    causal = {"architectures": ["Qwen3ForCausalLM"]}
    assert resolve("auto", "auto", tmp_path, causal) == ("generate", ("generate",))
    # vLLM's --convert auto on a pooling runner: an embedding head when the name gives no pooling default.
    assert resolve("pooling", "auto", tmp_path, causal) == ("pooling", EMBED_TASKS)
    assert resolve("pooling", "none", tmp_path, causal) == ("pooling", EMBED_TASKS)
    assert resolve("auto", "embed", tmp_path, causal) == ("pooling", EMBED_TASKS)
    assert resolve("pooling", "classify", tmp_path, causal) == ("pooling", CLASSIFY_TASKS)
    assert resolve("auto", "classify", tmp_path, causal) == ("pooling", CLASSIFY_TASKS)
    # By the architecture's ending, the first match winning: a classifier before a plain *Model.
    for arch, tasks in [("BertForSequenceClassification", CLASSIFY_TASKS), ("BertModel", EMBED_TASKS),
                        ("RobertaForTokenClassification", CLASSIFY_TASKS), ("Qwen3ClassificationModel", CLASSIFY_TASKS),
                        ("Qwen2RewardModel", EMBED_TASKS), ("XLMRobertaEmbeddingModel", EMBED_TASKS),
                        ("T5EncoderForTextEncoding", EMBED_TASKS)]:
        assert resolve("auto", "auto", tmp_path, {"architectures": [arch]}) == ("pooling", tasks), arch
    # A model that pools by itself keeps its head whatever --convert says (vLLM's adapters leave it as is).
    assert resolve("auto", "embed", tmp_path, {"architectures": ["BertForSequenceClassification"]}) == (
        "pooling", CLASSIFY_TASKS)
    assert resolve("pooling", "classify", tmp_path, {"architectures": ["BertModel"]}) == ("pooling", EMBED_TASKS)
    assert resolve("pooling", "classify", tmp_path, {"architectures": ["InternLM2ChatModel"]}) == (
        "pooling", CLASSIFY_TASKS)  # generative by its ending: the adapter applies
    assert resolve("auto", "auto", tmp_path, {"architectures": ["Mystery"]}) == ("generate", ("generate",))
    assert resolve("auto", "auto", tmp_path, {}) == ("generate", ("generate",))
    # A sentence-transformers checkpoint pools whatever its architecture says, with an embedding head.
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling"}]))
    assert resolve("auto", "auto", tmp_path, causal) == ("pooling", EMBED_TASKS)
    assert resolve("generate", "auto", tmp_path, causal) == ("generate", ("generate",))
    (tmp_path / "modules.json").write_text("[not json")
    assert resolve("auto", "auto", tmp_path, causal) == ("generate", ("generate",))


def test_the_sim_on_minilm_pools_with_its_hidden_size() -> None:
    sim, _ = build_backend(EngineConfig(model="minilm", backend="sim", sim_instant=True))
    assert (sim.info.runner, sim.info.tasks) == ("pooling", EMBED_TASKS)
    assert sim.info.max_model_len == 256  # sentence_bert_config's max_seq_length, as vLLM reads it
    got, _ = run(sim, pool_req("m", [101, 7592, 102], "embed"))  # type: ignore[arg-type]
    assert got["m"][1] == [384]


@pytest.mark.parametrize(("model", "labels"), [("tiny-classifier", 3), ("tiny-cross-encoder", 1)])
def test_the_sim_on_a_classifier_scores_its_labels(model: str, labels: int) -> None:
    sim, _ = build_backend(EngineConfig(model=model, backend="sim", sim_instant=True))
    assert (sim.info.runner, sim.info.tasks) == ("pooling", CLASSIFY_TASKS)
    got, _ = run(sim, pool_req("c", [101, 7592, 102, 2088, 102], "classify", token_type_split=3))  # type: ignore[arg-type]
    values, shape = got["c"]
    assert shape == [labels] and (math.isclose(sum(values), 1.0, rel_tol=1e-5) if labels > 1 else 0 < values[0] < 1)


def test_the_sim_on_tiny_generates_unless_asked_to_pool() -> None:
    tiny = checkpoints.resolve("tiny")
    hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    sim, _ = build_backend(EngineConfig(model="tiny", backend="sim", sim_instant=True))
    assert sim.info.runner == "generate"
    sim, _ = build_backend(EngineConfig(model="tiny", backend="sim", runner="pooling", convert="embed",
                                        sim_instant=True))
    assert (sim.info.runner, sim.info.tasks) == ("pooling", ("embed", "token_embed"))
    got, _ = run(sim, pool_req("e", [1, 2, 3], "embed"))  # type: ignore[arg-type]
    assert got["e"][1] == [hidden]
