"""Tests for the built-in decision-model checkpoints: the random BERT classifier and cross-encoder
(built once, labels, files, deterministic weights that Hugging Face loads without a missing key) and
the shipped MiniLM path."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoints
from checkpoints import bert

REPO_ROOT = Path(__file__).resolve().parents[3]
NAMES = ("tiny-classifier", "tiny-cross-encoder")
LABELS = {"tiny-classifier": {"0": "chat", "1": "code", "2": "math"}, "tiny-cross-encoder": {"0": "LABEL_0"}}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _header(path: Path) -> dict:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


@pytest.mark.parametrize("name", NAMES)
def test_build_writes_config_with_named_labels_and_the_minilm_tokenizer(cache: Path, name: str) -> None:
    path = checkpoints.resolve(name)
    assert path.parent == cache and path.name == f"{name}-{bert.RECIPE_VERSION}"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["model_type"] == "bert"
    assert config["id2label"] == LABELS[name]
    assert config["label2id"] == {v: int(k) for k, v in LABELS[name].items()}
    assert config["num_labels"] == len(LABELS[name])
    assert config["max_position_embeddings"] == 512
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    minilm = checkpoints.resolve("minilm")
    for file in bert.TOKENIZER_FILES:
        assert (path / file).read_bytes() == (minilm / file).read_bytes()
    assert not (path / bert.WEIGHTS_FILE).exists()
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp dirs left


@pytest.mark.parametrize("name", NAMES)
def test_resolve_twice_reuses_without_rebuilding(cache: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = checkpoints.resolve(name, weights=True)
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    def fail(*args: object) -> None:
        raise AssertionError(f"rebuilt an existing {name} checkpoint")

    monkeypatch.setattr(bert, "write_metadata", fail)
    monkeypatch.setattr(bert, "write_weights", fail)
    assert checkpoints.resolve(name, weights=True) == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == mtimes


def test_the_two_checkpoints_live_side_by_side(cache: Path) -> None:
    paths = {name: checkpoints.resolve(name, weights=True) for name in NAMES}
    assert len(set(paths.values())) == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in paths.values())


def test_weights_are_deterministic_float32_with_every_hf_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "a"))
    # One build adds weights to an existing weight-less dir, the other builds
    # everything at once: both must give the same bytes.
    checkpoints.resolve("tiny-classifier")
    a = checkpoints.resolve("tiny-classifier", weights=True) / bert.WEIGHTS_FILE
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "b"))
    b = checkpoints.resolve("tiny-classifier", weights=True) / bert.WEIGHTS_FILE
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    assert a != b and digest[0] == digest[1]
    assert [p.name for p in a.parent.iterdir() if p.name.startswith(".")] == []  # no temp files

    header = _header(a)
    assert {v["dtype"] for v in header.values()} == {"F32"}
    shapes = {k: v["shape"] for k, v in header.items()}
    assert shapes["bert.embeddings.word_embeddings.weight"] == [30522, 64]
    assert shapes["bert.embeddings.position_embeddings.weight"] == [512, 64]
    assert shapes["classifier.weight"] == [3, 64] and shapes["classifier.bias"] == [3]
    assert shapes["bert.pooler.dense.weight"] == [64, 64]
    assert sum(1 for k in shapes if k.startswith("bert.encoder.layer.")) == 2 * 16
    cross = _header(checkpoints.resolve("tiny-cross-encoder", weights=True) / bert.WEIGHTS_FILE)
    assert cross["classifier.weight"]["shape"] == [1, 64]


@pytest.mark.parametrize("name", NAMES)
def test_transformers_loads_every_weight_and_outputs_vary_with_the_text(cache: Path, name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = str(checkpoints.resolve(name, weights=True))
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    assert model.config.id2label == {int(k): v for k, v in LABELS[name].items()}
    tok = transformers.AutoTokenizer.from_pretrained(path)
    texts = ["hello there", "write a python function to sort a list", "what is the integral of x squared",
             "compile error in rust borrow checker", "good morning"]
    if name == "tiny-cross-encoder":
        enc = tok(["what is python"] * len(texts), texts, return_tensors="pt", padding=True)
    else:
        enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model.eval()(**enc).logits
    assert logits.shape == (len(texts), len(LABELS[name]))
    # A checkpoint whose outputs barely move tells a router nothing: the
    # scores must spread (and rank) differently from text to text.
    assert float(logits.std(dim=0).min()) > 0.3, logits


def test_building_without_weights_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys, checkpoints; [checkpoints.resolve(n) for n in checkpoints.BUILT_IN]; "
        "bad = {'torch', 'safetensors', 'transformers'} & set(sys.modules); "
        "assert not bad, bad"
    )
    env = {"FLEET_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_minilm_is_the_shipped_sentence_transformers_checkpoint(cache: Path) -> None:
    path = checkpoints.resolve("minilm", weights=True)
    assert checkpoints.resolve("minilm") == path
    assert json.loads((path / "config.json").read_text())["architectures"] == ["BertModel"]
    assert (path / "model.safetensors").stat().st_size > 80 * 2**20  # real weights, not a stub
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] is True
    assert not cache.exists()  # shipped, nothing built


def test_an_unknown_name_lists_the_built_in_ones() -> None:
    with pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.resolve("tiny-classifer")
    for name in checkpoints.BUILT_IN:
        assert repr(name) in str(info.value)
