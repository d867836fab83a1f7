"""What a checkpoint's files say that more than one service needs: its tokenizer (with a digest, so two
processes can tell they serve the same one), the EOS token id, the special tokens, the model config and
the context length it declares. Read once per process, at start."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine reads EOS ids through here and loads tokenizers only when it must
    from tokenizers import Tokenizer


@dataclass(slots=True, frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    sha256: str  # of tokenizer.json's bytes


def read_json(path: Path) -> dict[str, Any]:
    """The file's object, or {} when the checkpoint has no such file."""
    data = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def model_config(checkpoint: Path) -> dict[str, Any]:
    return read_json(checkpoint / "config.json")


def load_tokenizer(checkpoint: Path) -> LoadedTokenizer:
    from tokenizers import Tokenizer

    raw = (checkpoint / "tokenizer.json").read_bytes()
    tokenizer = Tokenizer.from_str(raw.decode())
    # A tokenizer.json may carry truncation and padding (all-MiniLM-L6-v2's pads every text to 128);
    # transformers resets both on every call unless asked, so vLLM never applies them: neither do we.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return LoadedTokenizer(tokenizer, hashlib.sha256(raw).hexdigest())


def eos_token_id(checkpoint: Path, tokenizer: Tokenizer | None = None) -> int | None:
    """The tokenizer's EOS id (what vLLM's input processor uses), else the model config's."""
    eos = read_json(checkpoint / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        tokenizer = tokenizer or load_tokenizer(checkpoint).tokenizer
        token_id = tokenizer.token_to_id(eos)
        if token_id is not None:
            return int(token_id)
    fallback = model_config(checkpoint).get("eos_token_id")
    if isinstance(fallback, list):
        fallback = fallback[0] if fallback else None
    return int(fallback) if fallback is not None else None


def special_tokens(tokenizer: Tokenizer) -> frozenset[str]:
    """The tokenizer's added tokens marked special."""
    return frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)


# The keys vLLM reads for a model's context length; the smallest one given wins, as there.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")


def config_max_model_len(config: dict[str, Any]) -> int | None:
    """The context length a model config declares, as vLLM derives it: the smallest of its length keys,
    times the rope scaling factor (yarn's from original_max_position_embeddings); None if it has none.
    An engine may serve less (its --max-model-len): with engines, a frontend asks them."""
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
