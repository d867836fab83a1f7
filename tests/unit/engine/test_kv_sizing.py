"""kv_sizing: the KV-cache bytes one block of the real model would hold."""
from __future__ import annotations

from services.engine.kv_sizing import kv_bytes_per_block


def test_kv_bytes_per_block_counts_k_and_v_of_every_layer_in_bf16() -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}
    assert kv_bytes_per_block(config, 16) == 2 * 2 * 2 * 64 * 2 * 16
    assert kv_bytes_per_block({**config, "head_dim": 128}, 16) == 2 * 2 * 2 * 128 * 2 * 16
