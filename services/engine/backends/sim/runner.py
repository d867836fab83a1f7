"""Which runner the sim engine plays and which tasks it serves, from --runner, --convert and the checkpoint,
decided as vLLM 0.32 decides them (its ModelConfig's runner and convert types). vLLM asks its model registry
first; the sim has none, so it uses what vLLM falls back to: the sentence-transformers files, then the
architecture name's ending (vLLM's table, shared with the router: checkpoints/architectures.py). Runs in the
engine process, at start.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpoints.architectures import defaults, own_head, sentence_transformers

EMBED_TASKS = ("embed", "token_embed")
CLASSIFY_TASKS = ("classify", "token_classify")


def resolve(runner: str, convert: str, checkpoint: Path, config_json: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(runner, tasks): ("generate", ("generate",)) or ("pooling", the tasks of its embedding or classifying
    head)."""
    architectures = [str(a) for a in config_json.get("architectures") or ()]
    if runner == "auto":
        if convert in ("auto", "none"):
            runner = "pooling" if sentence_transformers(checkpoint) else (defaults(architectures) or ("generate",))[0]
        else:
            runner = "pooling"
    if runner == "generate":
        return "generate", ("generate",)
    # A model that pools by itself keeps its own head: vLLM's --convert adapters leave a pooling model's
    # class as it is (as_embedding_model, as_seq_cls_model). Another gets the head --convert names, an
    # embedding one by default (vLLM's rule for sentence-transformers checkpoints of causal models).
    head = own_head(architectures) or (convert if convert in ("embed", "classify") else "embed")
    return "pooling", CLASSIFY_TASKS if head == "classify" else EMBED_TASKS
