"""The served model as the frontend needs it: tokenizer, chat template, EOS; loaded once per process."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

import checkpoints
from services.frontend.chat_template import ChatTemplate
from services.frontend.detokenizer import warm_up


@dataclass(slots=True)
class Model:
    name: str
    path: Path
    tokenizer: Tokenizer
    template: ChatTemplate
    eos_token_id: int | None
    special_tokens: frozenset[str] = frozenset()  # the tokenizer's added tokens marked special

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
        return cls(name, path, tokenizer, ChatTemplate.from_checkpoint(path), eos_id, special)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
