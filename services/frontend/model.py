"""The served model as the frontend needs it: tokenizer, chat template, EOS, the context length its
config declares; loaded once per process."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

import checkpoints
from services.frontend.chat_template import ChatTemplate
from services.frontend.text.detokenizer import warm_up


@dataclass(slots=True)
class Model:
    name: str
    path: Path
    tokenizer: Tokenizer
    template: ChatTemplate
    eos_token_id: int | None
    special_tokens: frozenset[str] = frozenset()  # the tokenizer's added tokens marked special
    config_max_model_len: int | None = None  # from config.json (render-only mode has no engine to ask)

    @classmethod
    def load(cls, model: str, name: str) -> Model:
        path = checkpoints.resolve(model)
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        eos = config.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        eos_id = tokenizer.token_to_id(eos) if isinstance(eos, str) else None
        warm_up(tokenizer)  # build the detokenizer's byte table now, not on the first request
        special = frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)
        return cls(name, path, tokenizer, ChatTemplate.from_checkpoint(path), eos_id, special,
                   config_max_model_len(_read_json(path / "config.json")))

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


# The keys vLLM reads for a model's context length; the smallest one given wins, as there.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")


def config_max_model_len(config: dict[str, Any]) -> int | None:
    """The context length a model config declares, as vLLM derives it: the smallest of its length keys,
    times the rope scaling factor (yarn's from original_max_position_embeddings); None if it has none.
    An engine may serve less (its --max-model-len): with engines, the frontend asks them."""
    lengths = [v for k in _LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0]
    if not lengths:
        return None
    length = min(lengths)
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        # These types' factor is already part of max_position_embeddings, as vLLM treats them.
        if isinstance(factor, (int, float)) and factor > 1 and kind not in ("su", "longrope", "llama3", "mrope"):
            if kind == "yarn" and isinstance(scaling.get("original_max_position_embeddings"), int):
                length = scaling["original_max_position_embeddings"]
            length = int(length * factor)
    return length


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
