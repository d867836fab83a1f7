"""Tests for checkpoints.resolve and the tiny checkpoint build (cache reuse,
atomic publication, tokenizer files, deterministic weights)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoints
from checkpoints import CheckpointError, tiny

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _safetensors_header(path: Path) -> dict:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_writes_config_tokenizer_and_template(cache: Path) -> None:
    path = checkpoints.resolve("tiny")
    assert path.parent == cache
    assert tiny.RECIPE_VERSION in path.name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert config["vocab_size"] == 151936
    assert config["tie_word_embeddings"] is True
    assert config["hidden_size"] <= 128 and config["num_hidden_layers"] == 2
    assert config["eos_token_id"] == 151645 and config["bos_token_id"] == 151643
    gen = json.loads((path / "generation_config.json").read_text())
    assert 151645 in gen["eos_token_id"]
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        assert (path / name).stat().st_size > 0
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    assert tok_config["eos_token"] == "<|im_end|>"
    assert not (path / tiny.WEIGHTS_FILE).exists()
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp dirs left


def test_default_cache_dir_is_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert checkpoints.cache_dir() == tmp_path / ".cache" / "fleet"


def test_resolve_twice_reuses_without_rebuilding(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = checkpoints.resolve("tiny")
    mtime = (first / "config.json").stat().st_mtime_ns

    def fail(dest: Path) -> None:
        raise AssertionError("rebuilt an existing tiny checkpoint")

    monkeypatch.setattr(tiny, "write_metadata", fail)
    assert checkpoints.resolve("tiny") == first
    assert (first / "config.json").stat().st_mtime_ns == mtime


def test_losing_the_build_race_uses_the_winner(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tiny.write_metadata
    target = cache / tiny.DIR_NAME

    def build_then_lose(dest: Path) -> None:
        real(dest)
        # Another process publishes its build while this one is still writing.
        target.mkdir()
        real(target)
        (target / "winner").touch()

    monkeypatch.setattr(tiny, "write_metadata", build_then_lose)
    assert checkpoints.resolve("tiny") == target
    assert (target / "winner").exists()
    assert [p.name for p in cache.iterdir()] == [target.name]


def test_build_without_weights_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys, checkpoints; checkpoints.resolve('tiny'); "
        "bad = {'torch', 'safetensors', 'transformers'} & set(sys.modules); "
        "assert not bad, bad"
    )
    env = {"FLEET_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("kind", ["missing", "file", "no-config", "no-weights"])
def test_bad_path_raises_naming_it(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "some-model"
    if kind == "file":
        bad.write_text("x")
    elif kind in ("no-config", "no-weights"):
        bad.mkdir()
    if kind == "no-weights":
        (bad / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="some-model") as info:
        checkpoints.resolve(str(bad), weights=kind == "no-weights")
    assert isinstance(info.value, ValueError)


def test_existing_directory_is_returned_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert checkpoints.resolve(str(tmp_path)) == tmp_path.resolve()
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert checkpoints.resolve(str(tmp_path), weights=True) == tmp_path.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model-00001-of-00002.safetensors"]


def test_tokenizer_round_trips_chinese(cache: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))
    text = "你好，世界！今天天气很好。"
    ids = tok.encode(text).ids
    assert len(ids) < len(text.encode("utf-8"))  # merged, not byte-per-token
    assert tok.decode(ids) == text
    assert tok.token_to_id("<|im_end|>") == 151645


EXPECTED_LAYER_SHAPES = {
    "input_layernorm.weight": [128],
    "self_attn.q_proj.weight": [128, 128],
    "self_attn.k_proj.weight": [64, 128],
    "self_attn.v_proj.weight": [64, 128],
    "self_attn.o_proj.weight": [128, 128],
    "self_attn.q_norm.weight": [32],
    "self_attn.k_norm.weight": [32],
    "post_attention_layernorm.weight": [128],
    "mlp.gate_proj.weight": [384, 128],
    "mlp.up_proj.weight": [384, 128],
    "mlp.down_proj.weight": [128, 384],
}


def test_weights_are_deterministic_with_hf_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "a"))
    # One build adds weights to an existing weight-less dir, the other builds
    # everything at once: both paths must give the same bytes.
    checkpoints.resolve("tiny")
    a = checkpoints.resolve("tiny", weights=True) / tiny.WEIGHTS_FILE
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "b"))
    b = checkpoints.resolve("tiny", weights=True) / tiny.WEIGHTS_FILE
    assert a != b and _sha256(a) == _sha256(b)
    assert [p.name for p in a.parent.iterdir() if p.name.startswith(".")] == []  # no temp files

    header = _safetensors_header(a)
    header.pop("__metadata__", None)
    expected = {"model.embed_tokens.weight": [151936, 128], "model.norm.weight": [128]}
    for i in range(2):
        expected.update({f"model.layers.{i}.{k}": v for k, v in EXPECTED_LAYER_SHAPES.items()})
    assert {k: v["shape"] for k, v in header.items()} == expected
    assert {v["dtype"] for v in header.values()} == {"BF16"}

    # Rows past the BPE vocabulary are zero, so greedy decoding never emits
    # special or out-of-tokenizer ids.
    start, end = header["model.embed_tokens.weight"]["data_offsets"]
    base = 8 + struct.unpack("<Q", a.read_bytes()[:8])[0]
    embed = a.read_bytes()[base + start:base + end]
    row = 128 * 2
    assert embed[151643 * row:] == bytes(len(embed) - 151643 * row)
    assert any(embed[:row])
