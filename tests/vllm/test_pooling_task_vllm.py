"""Which pooling tasks a model serves, and which one is its own, decided as vLLM 0.32 decides them: the
sim's runner and tasks by architecture (services/engine/backends/sim/runner.py, on the table the router shares:
checkpoints/architectures.py) against vLLM's table and
its offline LLMs, and the frontend's own-task choice (PoolingModel.pooling_task) against vLLM's
ModelConfig.get_pooling_task."""
from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import Tokenizer, models

from checkpoints.architectures import SUFFIX_DEFAULTS
from services.engine.backends.sim import runner
from services.engine.config import EngineConfig
from services.engine.wiring import build_backend
from services.frontend.requests.pooling_model import POOLING_TASKS, PoolingModel

# vllm's import trips torch's `reduce_op` FutureWarning (see test_tiny_model.py).
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ARCHITECTURES = ["Qwen3ForCausalLM", "BertModel", "BertForSequenceClassification", "RobertaForTokenClassification",
                 "Qwen3ClassificationModel", "Qwen2RewardModel", "Qwen2ForRewardModeling", "GteNewModel",
                 "T5EncoderForTextEncoding", "LlavaForConditionalGeneration", "InternLM2ChatModel", "GPT2LMHeadModel",
                 "ModernBertForAudioClassification", "Mystery"]


def test_the_shared_architecture_table_is_vllms() -> None:
    from vllm.config.model import iter_architecture_defaults

    assert [(s, r, c) for s, (r, c) in iter_architecture_defaults()] == list(SUFFIX_DEFAULTS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_sim_resolves_runner_and_head_as_vllms_fallbacks_do(arch: str, tmp_path: Path) -> None:
    """vLLM's choice for an architecture its registry does not know (the sim knows none)."""
    from vllm.config.model import try_match_architecture_defaults

    match = try_match_architecture_defaults(arch)
    vllm_runner = match[1][0] if match else "generate"
    pooling = try_match_architecture_defaults(arch, runner_type="pooling")
    vllm_convert = pooling[1][1] if pooling else "embed"
    tasks = runner.CLASSIFY_TASKS if vllm_convert == "classify" else runner.EMBED_TASKS
    config = {"architectures": [arch]}
    assert runner.resolve("auto", "auto", tmp_path, config) == (
        (vllm_runner, ("generate",)) if vllm_runner == "generate" else ("pooling", tasks))
    assert runner.resolve("pooling", "auto", tmp_path, config) == ("pooling", tasks)


def test_the_sim_serves_each_checkpoint_the_tasks_vllm_serves(
        minilm_llm: Any, classifier_llm: Any, cross_encoder_llm: Any) -> None:
    for name, llm in (("minilm", minilm_llm), ("tiny-classifier", classifier_llm),
                      ("tiny-cross-encoder", cross_encoder_llm)):
        sim, _ = build_backend(EngineConfig(model=name, backend="sim", sim_instant=True))
        assert sim.info.runner == "pooling", name
        assert set(sim.info.tasks) == set(llm.supported_tasks), name


def _vllms_own_task(architectures: list[str], served: tuple[str, ...]) -> str | None:
    from vllm.config.model import ModelConfig

    pooler = SimpleNamespace(task=None) if any(t in POOLING_TASKS for t in served) else None
    config = SimpleNamespace(pooler_config=pooler, architectures=architectures)
    return ModelConfig.get_pooling_task(config, served)  # type: ignore[arg-type]


SERVED = [tuple(c) for n in range(1, 5) for c in itertools.combinations(POOLING_TASKS, n)] + [("generate",)]


@pytest.mark.parametrize("architectures", [["BertModel"], ["BertForTokenClassification"], ["Qwen3ForCausalLM"], []])
def test_the_model_own_pooling_task_is_vllms(architectures: list[str]) -> None:
    tokenizer = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    model = PoolingModel("m", tokenizer, {}, architectures=tuple(architectures))
    for served in SERVED:
        assert model.pooling_task(served) == _vllms_own_task(architectures, served), served
