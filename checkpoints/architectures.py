"""What a checkpoint's architecture makes it, by vLLM 0.32's fallback rules (its registry aside): a generative
model or a pooling one, and, pooling, its head and its System One family. Pure: read by the engine's sim at
start (services/engine/backends/sim/runner.py) and by the router's engine mode, so both share one table."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import checkpoints

# vLLM's defaults by the ending of an architecture's name: (ending, runner, convert), the first match wins
# (so "…ForSequenceClassification" is a classifier before "…Model" makes an embedding model).
SUFFIX_DEFAULTS = (
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


def defaults(architectures: list[str]) -> tuple[str, str] | None:
    """(runner, convert) of the first architecture whose name's ending is in vLLM's table, or None."""
    for arch in architectures:
        for ending, runner, convert in SUFFIX_DEFAULTS:
            if arch.endswith(ending):
                return runner, convert
    return None


def own_head(architectures: list[str]) -> str | None:
    """The pooling head ("embed" or "classify") of a model that pools by itself (its ending's defaults
    are a pooling runner's); None for a generative or unknown one."""
    found = defaults(architectures)
    return found[1] if found is not None and found[0] == "pooling" else None


def sentence_transformers(checkpoint: Path) -> bool:
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


def family(model: str) -> str | None:
    """The System One family of a --model value (checkpoints.resolve: a built-in name or a directory):
    "embedding", "classifier" or "cross_encoder"; None for a generative (or unknown) architecture.
    Raises CheckpointError when the value names no checkpoint or its config.json cannot be read."""
    path = checkpoints.resolve(model)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise checkpoints.CheckpointError(f"--model {model!r}: cannot read {path}/config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise checkpoints.CheckpointError(f"--model {model!r}: {path}/config.json is not a JSON object")
    return checkpoint_family(path, config)


def checkpoint_family(checkpoint: Path, config: dict[str, Any]) -> str | None:
    """The family of a checkpoint directory and its config.json, as vLLM's auto runner sees it: its own
    pooling head if its architecture has one, else an embedding model if sentence-transformers pools it,
    else None (generative, or an architecture the table does not know). A classifying head with one
    label is a cross-encoder (vLLM scores a pair with that logit's sigmoid), with more a classifier."""
    architectures = [str(a) for a in config.get("architectures") or ()]
    head = own_head(architectures)
    if head is None:
        return "embedding" if sentence_transformers(checkpoint) else None
    if head == "embed":
        return "embedding"
    return "cross_encoder" if num_labels(config) == 1 else "classifier"


def num_labels(config: dict[str, Any]) -> int:
    """A transformers config's class count: its id2label's size, else num_labels, else transformers'
    default of 2 (PretrainedConfig writes id2label for every class, so the first is the usual answer)."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    count = config.get("num_labels")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 2
