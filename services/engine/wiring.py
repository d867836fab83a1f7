"""Builds one rank's backend from the config and the checkpoint (what the engine launcher wires
together): a pure factory; what is read from the checkpoint's files lives in prompting/model_files.py."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompting.model_files import eos_token_id, load_tokenizer, model_config, read_json
from services.engine.backend import Backend
from services.engine.config import GENERATE_BATCHED_TOKENS, EngineConfig
from services.engine.kv_sizing import kv_bytes_per_block

if TYPE_CHECKING:
    from services.engine.backends.sim.pooler import SimPooler

SIM_MAX_MODEL_LEN = 4096


def build_backend(config: EngineConfig) -> tuple[Backend, int]:
    """The backend for this rank and the vocabulary size that prompt token ids must fall in, with the
    --lora-modules adapters loaded (an adapter that fails to load fails the rank's start, saying why)."""
    import checkpoints

    path = checkpoints.resolve(config.model, weights=config.backend == "vllm")
    config_json = model_config(path)
    vocab_size = int(config_json["vocab_size"])
    backend: Backend
    if config.backend == "vllm":
        from services.engine.backends.vllm import VllmBackend

        backend = VllmBackend(config, path)
    else:
        backend = _build_sim(config, path, config_json)
    for name, adapter in config.lora_modules:
        try:
            backend.utility("add_lora", {"name": name, "path": adapter})
        except Exception as exc:
            backend.shutdown()
            raise RuntimeError(f"--lora-modules {name}={adapter}: {exc}") from exc
    return backend, vocab_size


def _build_sim(config: EngineConfig, path: Path, config_json: dict[str, Any]) -> Backend:
    from services.engine.backends.sim import SimBackend, SimConfig
    from services.engine.backends.sim.runner import resolve
    from services.engine.backends.sim.script import Script, load_script

    declared = _sentence_max_seq_length(path) or int(config_json.get("max_position_embeddings", SIM_MAX_MODEL_LEN))
    max_len = config.max_model_len or min(declared, SIM_MAX_MODEL_LEN)
    num_blocks = config.sim_num_kv_blocks
    if config.kv_cache_bytes is not None:
        num_blocks = max(1, config.kv_cache_bytes // kv_bytes_per_block(config_json, config.block_size or 16))
    sim = SimConfig(
        block_size=config.block_size or 16,
        num_kv_blocks=num_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.step_token_budget or GENERATE_BATCHED_TOKENS,
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
    tokenizer = load_tokenizer(path).tokenizer
    regular = tokenizer.get_vocab_size(with_added_tokens=False)
    script: Script | None = None
    if config.sim_script is not None:
        # Special tokens are kept both ways: rules may match chat-template markers, replies may hold
        # added tokens such as Qwen3's <tool_call>.
        script = load_script(config.sim_script,
                             lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                             lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    runner, tasks = resolve(config.runner, config.convert, path, config_json)
    pooler = _sim_pooler(config, path, config_json) if runner == "pooling" else None
    return SimBackend(sim, model=config.model, vocab_size=regular, eos_token_id=eos_token_id(path, tokenizer),
                      script=script, pooler=pooler, tasks=tasks)


# The sentence-transformers files vLLM reads max_seq_length from (its get_sentence_transformer_tokenizer_config).
_SENTENCE_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                     "sentence_camembert_config.json", "sentence_albert_config.json",
                     "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")


def _sentence_max_seq_length(path: Path) -> int | None:
    """A sentence-transformers checkpoint's max_seq_length, which replaces the model config's context length
    in vLLM (all-MiniLM-L6-v2: 256, not its 512 positions), so the sim serves what vLLM would."""
    for name in _SENTENCE_CONFIGS:
        data = read_json(path / name)
        if data:
            value = data.get("max_seq_length")
            return value if isinstance(value, int) and value > 0 else None
    return None


def _sim_pooler(config: EngineConfig, path: Path, config_json: dict[str, Any]) -> SimPooler:
    """The sim's pooled outputs shaped as the checkpoint's model would shape them (sim/pooler.py): its
    labels and embedding size read by the reader the frontend uses (prompting/pooling_config.py)."""
    from prompting.pooling_config import EmbeddingFacts, labels
    from services.engine.backends.sim.pooler import DEFAULT_HIDDEN_SIZE, SimPooler

    embedding = EmbeddingFacts.of(path, config_json)
    return SimPooler(model=config.model, hidden_size=embedding.size or DEFAULT_HIDDEN_SIZE,
                     num_labels=len(labels(config_json)), seed=config.seed, matryoshka=embedding.matryoshka,
                     matryoshka_dimensions=embedding.dimensions)
