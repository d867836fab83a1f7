"""Which runner the sim engine plays and which tasks it serves, from --runner, --convert and the checkpoint
(vLLM decides this from its model registry; the sim has none, so it reads the architecture's name and the
sentence-transformers files as vLLM's fallbacks do). Runs in the engine process, at start.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBED_TASKS = ("embed", "token_embed")
CLASSIFY_TASKS = ("classify", "token_classify")
# With --convert auto the sim serves every pooling task it can compute, whatever the architecture: it has
# no head to adapt, and routing tests need one engine for embeddings and class scores.
ALL_POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")
# Architecture name endings of generative models (vLLM's architecture defaults); other known
# architectures (…Model, …ForSequenceClassification, …) are pooling ones.
_GENERATIVE = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
_POOLING = ("Model", "ForSequenceClassification", "ForTokenClassification", "ForTextEncoding")


def resolve(runner: str, convert: str, checkpoint: Path, config_json: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(runner, tasks): ("generate", ("generate",)) or ("pooling", its pooling tasks)."""
    if runner == "auto":
        runner = "pooling" if convert in ("embed", "classify") or _is_pooling(checkpoint, config_json) else "generate"
    if runner == "generate":
        return "generate", ("generate",)
    if convert == "embed":
        return "pooling", EMBED_TASKS
    if convert == "classify":
        return "pooling", CLASSIFY_TASKS
    return "pooling", ALL_POOLING_TASKS


def _is_pooling(checkpoint: Path, config_json: dict[str, Any]) -> bool:
    """A sentence-transformers checkpoint (a Pooling module in modules.json) pools whatever its
    architecture; otherwise the first architecture's name decides (generative when unknown, as vLLM)."""
    modules = checkpoint / "modules.json"
    if modules.is_file():
        try:
            listed = json.loads(modules.read_text())
        except ValueError:
            listed = []
        if any(isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in listed):
            return True
    for arch in config_json.get("architectures") or ():
        if str(arch).endswith(_GENERATIVE):
            return False
        if str(arch).endswith(_POOLING):
            return True
    return False

