"""Class names of a classify deployment, by class index (router process, once at start).

vLLM's /classify names only the top class of each input (`label`) and gives every probability by
index (`probs`); to name them all the runtime needs the checkpoint's id2label. It is read here, from
the deployment's `labels:` when the config gives them, else from the checkpoint's config.json when
the model resolves to a local checkpoint (always so for a managed deployment: its workers load that
same directory); otherwise the probabilities are named LABEL_i, as transformers names a class its
config does not, and the start log says so."""
from __future__ import annotations

import json

import checkpoints
from services.router.config import DeploymentConfig


def class_names(config: DeploymentConfig) -> tuple[list[str] | None, str]:
    """The names by class index (None: unknown here) and where they came from, for the start log."""
    if config.labels:
        return list(config.labels), "the config's labels"
    try:
        path = checkpoints.resolve(config.model)
        raw = json.loads((path / "config.json").read_text())
    except (checkpoints.CheckpointError, OSError, ValueError) as exc:
        return None, f"unknown ({exc}): probabilities named LABEL_i; set labels: to name them"
    names = id2label(raw)
    if names is None:
        return None, f"unknown ({path}/config.json has no id2label): probabilities named LABEL_i"
    return names, f"{path}/config.json"


def id2label(config: dict[str, object]) -> list[str] | None:
    """A transformers config's id2label ({"0": "neg", "1": "pos"}) as a list by index."""
    raw = config.get("id2label")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        by_index = {int(k): str(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_index) != list(range(len(by_index))):
        return None
    return [by_index[i] for i in range(len(by_index))]
