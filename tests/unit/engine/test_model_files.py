"""model_files: the EOS id and KV block size read from a checkpoint's JSON files."""
from __future__ import annotations

import json
from pathlib import Path

import checkpoints
from services.engine.model_files import eos_token_id, kv_bytes_per_block, model_config, read_json


def _write(path: Path, name: str, data: object) -> None:
    (path / name).write_text(json.dumps(data))


def test_eos_is_the_tokenizers_id_for_the_configured_token() -> None:
    path = checkpoints.resolve("tiny", weights=False)
    from tokenizers import Tokenizer

    eos = read_json(path / "tokenizer_config.json")["eos_token"]
    expected = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id(eos)
    assert eos_token_id(path) == expected


def test_eos_falls_back_to_the_model_config(tmp_path: Path) -> None:
    _write(tmp_path, "config.json", {"eos_token_id": [7, 9]})
    assert eos_token_id(tmp_path) == 7
    _write(tmp_path, "config.json", {"eos_token_id": 3})
    assert eos_token_id(tmp_path) == 3
    _write(tmp_path, "config.json", {})
    assert eos_token_id(tmp_path) is None


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    assert model_config(tmp_path) == {}


def test_kv_bytes_per_block_counts_k_and_v_of_every_layer_in_bf16() -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}
    assert kv_bytes_per_block(config, 16) == 2 * 2 * 2 * 64 * 2 * 16
    assert kv_bytes_per_block({**config, "head_dim": 128}, 16) == 2 * 2 * 2 * 128 * 2 * 16
