"""Builds one rank's backend from the config and the checkpoint (what `__main__` wires together)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.engine.backend import Backend
from services.engine.config import EngineConfig

SIM_MAX_MODEL_LEN = 4096


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def eos_token_id(checkpoint: Path, tokenizer: Any = None) -> int | None:
    """The tokenizer's EOS id (what vLLM's input processor uses), else the model config's."""
    from tokenizers import Tokenizer

    eos = _read_json(checkpoint / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        tokenizer = tokenizer or Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        token_id = tokenizer.token_to_id(eos)
        if token_id is not None:
            return int(token_id)
    fallback = _read_json(checkpoint / "config.json").get("eos_token_id")
    if isinstance(fallback, list):
        fallback = fallback[0] if fallback else None
    return int(fallback) if fallback is not None else None


def build_backend(config: EngineConfig) -> tuple[Backend, int]:
    """The backend for this rank and the vocabulary size that prompt token ids must fall in."""
    import checkpoints

    path = checkpoints.resolve(config.model, weights=config.backend == "vllm")
    model_config = _read_json(path / "config.json")
    vocab_size = int(model_config["vocab_size"])
    if config.backend == "vllm":
        from services.engine.backends.vllm import VllmBackend

        return VllmBackend(config, path), vocab_size
    return _build_sim(config, path, model_config), vocab_size


def _build_sim(config: EngineConfig, path: Path, model_config: dict[str, Any]) -> Backend:
    from tokenizers import Tokenizer

    from services.engine.backends.sim import SimBackend, SimConfig

    max_len = config.max_model_len or min(
        int(model_config.get("max_position_embeddings", SIM_MAX_MODEL_LEN)), SIM_MAX_MODEL_LEN
    )
    num_blocks = config.sim_num_kv_blocks
    if config.kv_cache_bytes is not None:
        num_blocks = max(1, config.kv_cache_bytes // kv_bytes_per_block(model_config, config.block_size or 16))
    sim = SimConfig(
        block_size=config.block_size or 16,
        num_kv_blocks=num_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_len,
        prefill_tps=config.sim_prefill_tps,
        decode_ms=config.sim_decode_ms,
        decode_ms_per_seq=config.sim_decode_ms_per_seq,
        instant=config.sim_instant,
        eos_rate=config.sim_eos_rate,
        seed=config.seed,
        echo=config.sim_echo,
    )
    # Generated ids come from the regular vocabulary: special tokens would end or garble streams.
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    regular = tokenizer.get_vocab_size(with_added_tokens=False)
    return SimBackend(sim, model=config.model, vocab_size=regular,
                      eos_token_id=eos_token_id(path, tokenizer))


def kv_bytes_per_block(model_config: dict[str, Any], block_size: int) -> int:
    """K and V, every layer, bf16: what one block of the real model would hold."""
    heads = int(model_config.get("num_key_value_heads", model_config.get("num_attention_heads", 1)))
    head_dim = int(model_config.get("head_dim") or
                   model_config["hidden_size"] // model_config["num_attention_heads"])
    return 2 * int(model_config["num_hidden_layers"]) * heads * head_dim * 2 * block_size
