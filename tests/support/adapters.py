"""A stand-in LoRA adapter directory for the sim backend, which loads nothing from it but, as the vllm
backend does, accepts only a directory holding an adapter_config.json."""
from __future__ import annotations

import json
from pathlib import Path


def fake_adapter(root: Path, name: str = "adapter") -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    return path
