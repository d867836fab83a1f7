"""What a checkpoint's architecture makes it (checkpoints/architectures.py): the built-in models' System One
families, the rules on checkpoint directories written here, and the sim still deciding its runner on the
table it now shares (tests/vllm/test_pooling_task_vllm.py holds the table equal to vLLM's)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import checkpoints
from checkpoints import architectures
from checkpoints.architectures import SUFFIX_DEFAULTS, checkpoint_family, family
from services.engine.backends.sim import runner

# The table as the sim carried it before it moved here (services/engine/backends/sim/runner.py).
SIMS_TABLE = (
    ("ForCausalLM", "generate", "none"), ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"), ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"), ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"), ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"), ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"), ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"), ("RewardModel", "pooling", "embed"), ("Model", "pooling", "embed"),
)
ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def test_the_table_is_the_one_the_sim_used_and_the_sim_reads_it() -> None:
    assert SUFFIX_DEFAULTS == SIMS_TABLE
    assert not hasattr(runner, "_SUFFIX_DEFAULTS"), "one copy: the sim imports the table"
    assert runner.defaults is architectures.defaults


@pytest.mark.parametrize(("model", "expected"), [
    ("tiny", None), ("tiny-classifier", "classifier"), ("tiny-cross-encoder", "cross_encoder"),
    ("minilm", "embedding")])
def test_the_built_in_models_families(model: str, expected: str | None) -> None:
    assert family(model) == expected


def _checkpoint(path: Path, config: dict[str, Any], modules: list[dict[str, Any]] | None = None) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (path / "modules.json").write_text(json.dumps(modules))
    return path


@pytest.mark.parametrize(("config", "modules", "expected"), [
    ({"architectures": ["XLMRobertaForSequenceClassification"], "id2label": {"0": "LABEL_0"}}, None,
     "cross_encoder"),
    ({"architectures": ["XLMRobertaForSequenceClassification"], "num_labels": 1}, None, "cross_encoder"),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "neg", "1": "pos"}}, None, "classifier"),
    ({"architectures": ["BertForSequenceClassification"]}, None, "classifier"),  # transformers' default: 2 labels
    ({"architectures": ["Qwen3ClassificationModel"], "num_labels": 5}, None, "classifier"),
    ({"architectures": ["GteNewModel"]}, None, "embedding"),
    ({"architectures": ["T5EncoderForTextEncoding"]}, None, "embedding"),
    ({"architectures": ["Qwen3ForCausalLM"]}, None, None),
    ({"architectures": ["Qwen3ForCausalLM"]}, ST_MODULES, "embedding"),  # sentence-transformers pools it
    ({"architectures": ["Mystery"]}, None, None),
    ({}, None, None),
    ({}, ST_MODULES, "embedding"),
])
def test_a_checkpoints_family_by_vllms_rules(config: dict[str, Any], modules: list[dict[str, Any]] | None,
                                              expected: str | None, tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "m", config, modules)
    assert checkpoint_family(path, config) == expected
    assert family(str(path)) == expected


def test_a_modules_json_without_a_pooling_module_or_unreadable_is_not_sentence_transformers(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"]}
    no_pooling = _checkpoint(tmp_path / "a", config, [ST_MODULES[0]])
    assert family(str(no_pooling)) is None
    broken = _checkpoint(tmp_path / "b", config)
    (broken / "modules.json").write_text("{not json")
    assert family(str(broken)) is None


def test_what_names_no_checkpoint_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(checkpoints.CheckpointError, match="not a directory"):
        family(str(tmp_path / "absent"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(checkpoints.CheckpointError, match="is not a JSON object"):
        family(str(bad))
