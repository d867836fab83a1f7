"""The context length a model config declares (services/frontend/model.py), which a render-only
frontend checks requests against, read as vLLM reads it."""
from __future__ import annotations

from typing import Any

import pytest

from prompting.model_files import config_max_model_len
from services.frontend.model import Model


@pytest.mark.parametrize(("config", "length"), [
    ({"max_position_embeddings": 4096}, 4096),
    ({"max_position_embeddings": 8192, "seq_length": 2048}, 2048),  # the smallest key given
    ({"n_positions": 1024}, 1024),
    ({}, None),
    ({"max_position_embeddings": "4096"}, None),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072),
    ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 32768}}, 131072),
    ({"max_position_embeddings": 4096, "rope_scaling": None}, 4096),
])
def test_config_max_model_len(config: dict[str, Any], length: int | None) -> None:
    assert config_max_model_len(config) == length


def test_the_tiny_model_declares_4096() -> None:
    assert Model.load("tiny", "tiny").config_max_model_len == 4096
