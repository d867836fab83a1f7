"""Build the random-weight BERT decision-model checkpoints, ``tiny-classifier`` (a sequence classifier
with named labels) and ``tiny-cross-encoder`` (one label, for score and rerank), on the MiniLM
tokenizer; cached on disk and reused like ``tiny``. Run by whichever process resolves the name."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkpoints import cache, minilm

if TYPE_CHECKING:
    import torch

# Bump whenever anything below changes what gets written, so stale caches are
# never reused.
RECIPE_VERSION = "bert-v1"
WEIGHTS_FILE = "model.safetensors"
# BertTokenizer's files as the MiniLM checkpoint ships them (uncased WordPiece, 30,522 ids).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# Init scales. Projections of std GAIN/sqrt(fan_in): at gain 1 the [CLS]
# vector is dominated by its own fixed embedding, so every text gets nearly the
# same probabilities (the same top label for ten varied texts); at gain 3 the
# attention and MLP blocks outweigh the residual, and the top label and the
# cross-encoder's scores change from text to text. Biases are random (not
# zero) so a bias that a loader drops or misplaces changes the outputs.
GAIN = 3.0
EMBED_STD = 1.0
BIAS_STD = 0.1

BASE_CONFIG: dict[str, Any] = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "classifier_dropout": None,
    "torch_dtype": "float32",
    "dtype": "float32",
    "transformers_version": "4.51.0",
}


@dataclass(frozen=True, slots=True)
class Recipe:
    """One BERT checkpoint: its ``--model`` name, its labels in id order, its weights' seed."""

    name: str
    labels: tuple[str, ...]
    seed: int

    @property
    def dir_name(self) -> str:
        return f"{self.name}-{RECIPE_VERSION}"

    def config(self) -> dict[str, Any]:
        id2label = {str(i): label for i, label in enumerate(self.labels)}
        label2id = {label: i for i, label in enumerate(self.labels)}
        return {**BASE_CONFIG, "num_labels": len(self.labels), "id2label": id2label, "label2id": label2id}


CLASSIFIER = Recipe("tiny-classifier", ("chat", "code", "math"), seed=20240611)
# One logit: vLLM scores a pair with its sigmoid, as sentence-transformers' CrossEncoder does.
CROSS_ENCODER = Recipe("tiny-cross-encoder", ("LABEL_0",), seed=20240612)
RECIPES = {r.name: r for r in (CLASSIFIER, CROSS_ENCODER)}


def tokenizer_source_dir() -> Path:
    """The MiniLM checkpoint's folder, whose BERT tokenizer files these checkpoints reuse."""
    source = minilm.path()
    if source is None:
        raise RuntimeError(f"{minilm.PACKAGE} is not installed; it ships the BERT tokenizer files")
    return source


def ensure(cache_dir: Path, recipe: Recipe, *, weights: bool = False) -> Path:
    """Return ``recipe``'s checkpoint under ``cache_dir``, building what is missing."""
    return cache.publish(cache_dir, recipe.dir_name,
                         write_metadata=lambda dest: write_metadata(dest, recipe),
                         write_weights=lambda path: write_weights(path, recipe),
                         weights_file=WEIGHTS_FILE, weights=weights)


def write_metadata(dest: Path, recipe: Recipe) -> None:
    """Write the config and the tokenizer files into ``dest``."""
    src = tokenizer_source_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dest / name)
    (dest / "config.json").write_text(json.dumps(recipe.config(), indent=2) + "\n", encoding="utf-8")


def write_weights(path: Path, recipe: Recipe) -> None:
    """Write the recipe's deterministic random weights as one safetensors file."""
    from safetensors.torch import save_file

    save_file(make_weights(recipe), str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def weight_shapes(num_labels: int) -> dict[str, tuple[int, ...]]:
    """Every tensor name (Hugging Face's) and shape, in the (fixed) order they are generated."""
    c = BASE_CONFIG
    h, inter = c["hidden_size"], c["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "bert.embeddings.word_embeddings.weight": (c["vocab_size"], h),
        "bert.embeddings.position_embeddings.weight": (c["max_position_embeddings"], h),
        "bert.embeddings.token_type_embeddings.weight": (c["type_vocab_size"], h),
    }
    shapes.update(_layer_norm("bert.embeddings.LayerNorm", h))
    for i in range(c["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes.update(_linear(p + f"attention.self.{proj}", h, h))
        shapes.update(_linear(p + "attention.output.dense", h, h))
        shapes.update(_layer_norm(p + "attention.output.LayerNorm", h))
        shapes.update(_linear(p + "intermediate.dense", h, inter))
        shapes.update(_linear(p + "output.dense", inter, h))
        shapes.update(_layer_norm(p + "output.LayerNorm", h))
    shapes.update(_linear("bert.pooler.dense", h, h))
    shapes.update(_linear("classifier", h, num_labels))
    return shapes


def _linear(prefix: str, fan_in: int, fan_out: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (fan_out, fan_in), f"{prefix}.bias": (fan_out,)}


def _layer_norm(prefix: str, size: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (size,), f"{prefix}.bias": (size,)}


def make_weights(recipe: Recipe) -> dict[str, torch.Tensor]:
    """Generate the weights from the recipe's seed (float32, stored as such)."""
    import torch

    gen = torch.Generator().manual_seed(recipe.seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(len(recipe.labels)).items():
        if "LayerNorm" in name:
            t = torch.ones(shape) if name.endswith(".weight") else torch.zeros(shape)
        elif "embeddings" in name:
            t = torch.randn(shape, generator=gen) * EMBED_STD
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=gen) * BIAS_STD
        else:
            t = torch.randn(shape, generator=gen) * (GAIN / shape[1] ** 0.5)
        out[name] = t.contiguous()
    return out
