"""The KV-cache bytes one block of the real model would hold, from its config (engine process; the sim
backend sizes its block pool by it). The rest of what the engine reads from a checkpoint's files (config,
EOS id) is the shared prompting library's `model_files`."""
from __future__ import annotations

from typing import Any


def kv_bytes_per_block(config: dict[str, Any], block_size: int) -> int:
    """K and V, every layer, bf16: what one block of the real model would hold."""
    heads = int(config.get("num_key_value_heads", config.get("num_attention_heads", 1)))
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return 2 * int(config["num_hidden_layers"]) * heads * head_dim * 2 * block_size
