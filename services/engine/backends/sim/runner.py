"""Which runner the sim engine plays and which tasks it serves, from --runner, --convert and the checkpoint,
decided as vLLM 0.32 decides them (its ModelConfig's runner and convert types). vLLM asks its model registry
first; the sim has none, so it uses what vLLM falls back to: the sentence-transformers files, then the
architecture name's ending. Runs in the engine process, at start.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBED_TASKS = ("embed", "token_embed")
CLASSIFY_TASKS = ("classify", "token_classify")
# vLLM's defaults by the ending of an architecture's name: (ending, runner, convert), the first match wins
# (so "…ForSequenceClassification" is a classifier before "…Model" makes an embedding model).
_SUFFIX_DEFAULTS = (
    ("ForCausalLM", "generate", "none"),
    ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"),
    ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"),
    ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"),
    ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"),
    ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"),
    ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"),
    ("RewardModel", "pooling", "embed"),
    ("Model", "pooling", "embed"),
)


def resolve(runner: str, convert: str, checkpoint: Path, config_json: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(runner, tasks): ("generate", ("generate",)) or ("pooling", the tasks of its embedding or classifying
    head)."""
    architectures = [str(a) for a in config_json.get("architectures") or ()]
    if runner == "auto":
        if convert in ("auto", "none"):
            runner = "pooling" if _sentence_transformers(checkpoint) else (_defaults(architectures) or ("generate",))[0]
        else:
            runner = "pooling"
    if runner == "generate":
        return "generate", ("generate",)
    # A model that pools by itself keeps its own head: vLLM's --convert adapters leave a pooling model's
    # class as it is (as_embedding_model, as_seq_cls_model). Another gets the head --convert names, an
    # embedding one by default (vLLM's rule for sentence-transformers checkpoints of causal models).
    head = _own_head(architectures) or (convert if convert in ("embed", "classify") else "embed")
    return "pooling", CLASSIFY_TASKS if head == "classify" else EMBED_TASKS


def _defaults(architectures: list[str]) -> tuple[str, str] | None:
    """(runner, convert) of the first architecture whose name's ending is in vLLM's table, or None."""
    for arch in architectures:
        for ending, runner, convert in _SUFFIX_DEFAULTS:
            if arch.endswith(ending):
                return runner, convert
    return None


def _own_head(architectures: list[str]) -> str | None:
    """The pooling head of a model that pools by itself (its ending's defaults are a pooling runner's);
    None for a generative or unknown one."""
    found = _defaults(architectures)
    return found[1] if found is not None and found[0] == "pooling" else None


def _sentence_transformers(checkpoint: Path) -> bool:
    """A sentence-transformers checkpoint (a Pooling module in modules.json) pools whatever its architecture."""
    modules = checkpoint / "modules.json"
    if not modules.is_file():
        return False
    try:
        listed = json.loads(modules.read_text())
    except ValueError:
        return False
    return isinstance(listed, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in listed)
