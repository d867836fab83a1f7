"""The served model as the frontend needs it: tokenizer, chat template, EOS, the context length its
config declares; loaded once per process (the files are read by the shared prompting library)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

import checkpoints
from prompting.chat_template import ChatTemplate
from prompting.model_files import config_max_model_len, eos_token_id, load_tokenizer, model_config, special_tokens
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
    tokenizer_sha256: str = ""

    @classmethod
    def load(cls, model: str, name: str) -> Model:
        path = checkpoints.resolve(model)
        loaded = load_tokenizer(path)
        tokenizer = loaded.tokenizer
        warm_up(tokenizer)  # build the detokenizer's byte table now, not on the first request
        return cls(name, path, tokenizer, ChatTemplate.from_checkpoint(path), eos_token_id(path, tokenizer),
                   special_tokens(tokenizer), config_max_model_len(model_config(path)), loaded.sha256)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
