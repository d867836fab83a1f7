"""prompting/pooling_config.py: a checkpoint's embedding size as vLLM's ModelConfig.embedding_size reads it
(config.json's embedding_size, else the last sentence-transformers Dense layer's out_features, else
hidden_size), the same for the frontend's `dimensions` range and the sim engine's vectors."""
from __future__ import annotations

import json
from pathlib import Path

from prompting.pooling_config import EmbeddingFacts, embedding_size, labels
from services.engine.config import EngineConfig
from services.engine.wiring import _sim_pooler

DENSE = "sentence_transformers.models.Dense"


def checkpoint(tmp_path: Path, config: dict[str, object], modules: list[dict[str, object]] | None = None,
               dense: dict[str, int] | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    for folder, out in (dense or {}).items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps({"in_features": 768, "out_features": out}))
    return tmp_path


def test_the_last_dense_layer_sets_the_embedding_size(tmp_path: Path) -> None:
    modules = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "path": "2_Dense", "type": DENSE}, {"idx": 3, "path": "3_Dense", "type": DENSE}]
    path = checkpoint(tmp_path, {"hidden_size": 768, "matryoshka_dimensions": [64, 256]}, modules,
                      {"2_Dense": 512, "3_Dense": 256})
    config = json.loads((path / "config.json").read_text())
    assert EmbeddingFacts.of(path, config) == EmbeddingFacts(256, True, (64, 256))
    sim = _sim_pooler(EngineConfig(model=str(path), backend="sim"), path, config)
    assert sim.hidden_size == 256 and sim.matryoshka_dimensions == (64, 256)


def test_embedding_size_in_the_config_wins_and_hidden_size_is_the_fallback(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, {}, [{"path": "2_Dense", "type": DENSE}], {"2_Dense": 256})
    assert embedding_size(path, {"embedding_size": 1024, "hidden_size": 768}) == 1024
    assert embedding_size(path, {"hidden_size": 768}) == 256
    (path / "modules.json").write_text("not json")
    assert embedding_size(path, {"hidden_size": 768}) == 768  # unreadable: as vLLM, no Dense layers
    assert embedding_size(tmp_path / "none", {}) is None


def test_the_sim_and_the_frontend_read_one_set_of_labels(tmp_path: Path) -> None:
    config = {"hidden_size": 64, "id2label": {"0": "chat", "1": "code", "2": "math"}, "num_labels": 5}
    path = checkpoint(tmp_path, config)
    sim = _sim_pooler(EngineConfig(model=str(path), backend="sim"), path, config)
    assert sim.num_labels == len(labels(config)) == 3
