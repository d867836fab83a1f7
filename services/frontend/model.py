"""The served model as the frontend needs it: tokenizer, chat template (None for a checkpoint that has
none, as most embedding models: its chat routes answer 400, as vLLM's do), EOS, the context length its
config declares; loaded once per process (the files are read by the shared prompting library)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

import checkpoints
from prompting.chat_template import ChatTemplate, MissingTemplate
from prompting.model_files import config_max_model_len, eos_token_id, load_tokenizer, model_config, special_tokens
from prompting.pooling_config import EmbeddingFacts
from services.frontend.text.detokenizer import warm_up


@dataclass(slots=True)
class Model:
    name: str
    path: Path
    tokenizer: Tokenizer
    template: ChatTemplate | None
    eos_token_id: int | None
    special_tokens: frozenset[str] = frozenset()  # the tokenizer's added tokens marked special
    config_max_model_len: int | None = None  # from config.json (render-only mode has no engine to ask)
    tokenizer_sha256: str = ""
    embedding: EmbeddingFacts | None = None  # what the `dimensions` of an embeddings request may be
    # With the added tokens: the ids a request may name. Asked of the tokenizer once, not per request (it
    # walks the added vocabulary each time).
    vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)


    @classmethod
    def load(cls, model: str, name: str) -> Model:
        path = checkpoints.resolve(model)
        loaded = load_tokenizer(path)
        tokenizer = loaded.tokenizer
        warm_up(tokenizer)  # build the detokenizer's byte table now, not on the first request
        config = model_config(path)
        return cls(name, path, tokenizer, _template(path), eos_token_id(path, tokenizer),
                   special_tokens(tokenizer), config_max_model_len(config), loaded.sha256,
                   EmbeddingFacts.of(path, config))

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


# vLLM's words when a chat route meets a tokenizer without a template (its renderers/hf.py), a 400 there.
NO_CHAT_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
                    "chat template if the tokenizer does not define one.")


def _template(path: Path) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none (a broken one still fails the start)."""
    try:
        return ChatTemplate.from_checkpoint(path)
    except MissingTemplate:
        return None
