"""What the engine process reads from a checkpoint's JSON files: the model config, the EOS token id,
and the KV-cache bytes one block of the real model would hold. Used by both backends."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any]:
    """The file's object, or {} when the checkpoint has no such file."""
    data = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def model_config(checkpoint: Path) -> dict[str, Any]:
    return read_json(checkpoint / "config.json")


def eos_token_id(checkpoint: Path, tokenizer: Any = None) -> int | None:
    """The tokenizer's EOS id (what vLLM's input processor uses), else the model config's."""
    from tokenizers import Tokenizer

    eos = read_json(checkpoint / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        tokenizer = tokenizer or Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        token_id = tokenizer.token_to_id(eos)
        if token_id is not None:
            return int(token_id)
    fallback = model_config(checkpoint).get("eos_token_id")
    if isinstance(fallback, list):
        fallback = fallback[0] if fallback else None
    return int(fallback) if fallback is not None else None


def kv_bytes_per_block(config: dict[str, Any], block_size: int) -> int:
    """K and V, every layer, bf16: what one block of the real model would hold."""
    heads = int(config.get("num_key_value_heads", config.get("num_attention_heads", 1)))
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return 2 * int(config["num_hidden_layers"]) * heads * head_dim * 2 * block_size
