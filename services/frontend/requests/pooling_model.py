"""What the classify, score and rerank translators know of the served model beyond what its engines
say (context length, tasks): its name, its tokenizer, and what its config.json declares, read as
transformers and vLLM read it (labels: prompting/pooling_config.py, which the sim engine reads too).
Built once per API server process, at start."""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from prompting.pooling_config import labels

# vLLM's pooling tasks, in the order it prefers them as a model's own (ModelConfig.get_pooling_task).
POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")


@dataclass(frozen=True, slots=True)
class PoolingModel:
    """`name`: the model name the responses carry. `id2label`: class names by index (`/classify`'s
    labels; one label makes a cross-encoder, which `/score` and `/rerank` need). `token_types`: the
    model reads token type ids (BERT's type_vocab_size 2), so a scored pair tells the engine where the
    second text starts. `use_sep_token`: a pair is encoded with the tokenizer's separators (vLLM's
    ModelConfig.use_sep_token; False for an LLM used as a reranker: the two texts are joined).
    `architectures`: config.json's, which the model's own pooling task depends on."""

    name: str
    tokenizer: Tokenizer
    id2label: Mapping[int, str]
    token_types: bool = False
    use_sep_token: bool = True
    architectures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A tokenizer.json may carry its training pipeline's truncation and padding (all-MiniLM-L6-v2's
        # pads every text to 128 tokens). transformers turns both off on every call unless asked, so
        # vLLM never applies them; the frontend must load the tokenizer with both off.
        if self.tokenizer.truncation is not None or self.tokenizer.padding is not None:
            raise ValueError("the tokenizer truncates or pads by its tokenizer.json settings, which vLLM never "
                             "applies: load it with no_truncation() and no_padding()")

    @classmethod
    def of(cls, name: str, tokenizer: Tokenizer, config: Mapping[str, Any]) -> PoolingModel:
        """The facts of a checkpoint whose config.json is `config`."""
        type_vocab = config.get("type_vocab_size")
        sep = config.get("use_sep_token", config.get("use_pad_token", True))  # vLLM's old name second
        archs = config.get("architectures")
        return cls(name, tokenizer, labels(config), isinstance(type_vocab, int) and type_vocab > 1, sep is not False,
                   tuple(str(a) for a in archs) if isinstance(archs, list) else ())

    def pooling_task(self, served: Collection[str]) -> str | None:
        """The model's own pooling task among the tasks its engines serve, chosen as vLLM 0.32 chooses it
        (ModelConfig.get_pooling_task; this server has no --pooler-config to name one): a token
        classifier's per-token labels, else the first served of embed, classify, token_embed and
        token_classify. vLLM serves /pooling only for this task, /v1/embeddings only when it is embed and
        /classify only when it is classify. None for a generating model."""
        if "token_classify" in served and any("ForTokenClassification" in a for a in self.architectures):
            return "token_classify"
        return next((t for t in POOLING_TASKS if t in served), None)

    def task_words(self, served: Collection[str]) -> str:
        """What the model does, for a refusal: its own pooling task, else what its engines serve."""
        own = self.pooling_task(served)
        return f"its pooling task is {own!r}" if own else f"its engines serve {', '.join(sorted(served)) or 'no task'}"

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

