"""The System One API as the model runtime speaks it to an attached deployment with `api: systemone`
(router process): an engine-mode router or another compatible server. The request body of each call
and the checked reading of each answer into the runtime's results. No I/O.

Shapes are our own (docs/router.md, listeners/systemone.py): POST /v1/systemone with `{model, input}`
(classifier, embedding) or `{model, query, documents}` (cross_encoder), answered by `{object, data,
usage}` whose rows are in input order: `{index, label, probability, probs}`, `{index, embedding}` or
`{index, score}`. A server of the API names its classes itself, so no class names are needed here.
"""
from __future__ import annotations

from typing import Any

from services.router.runtime.models import Label
from services.router.runtime.pooling_api import BadAnswer, Call, finite, floats, rows_by_index

PATH = "/v1/systemone"
OBJECTS = {"classifier": "systemone.classification", "embedding": "systemone.embedding",
           "cross_encoder": "systemone.scores"}


def embed_call(model: str, texts: list[str]) -> Call:
    return Call(PATH, {"model": model, "input": texts}, len(texts))


def classify_call(model: str, texts: list[str]) -> Call:
    return Call(PATH, {"model": model, "input": texts}, len(texts))


def rerank_call(model: str, query: str, documents: list[str]) -> Call:
    return Call(PATH, {"model": model, "query": query, "documents": documents}, len(documents))


def embeddings(answer: dict[str, Any], expected: int) -> list[list[float]]:
    rows = _rows(answer, "embedding", expected)
    return [floats(row.get("embedding"), f"data[{i}].embedding") for i, row in enumerate(rows)]


def labels(answer: dict[str, Any], expected: int) -> list[Label]:
    """Each text's classes by the server's names; its `label` must be its most probable class and
    `probability` that class's probability, as the API promises."""
    results = []
    for i, row in enumerate(_rows(answer, "classifier", expected)):
        probs = row.get("probs")
        if not isinstance(probs, dict) or not probs or not all(
                isinstance(k, str) and finite(v) for k, v in probs.items()):
            raise BadAnswer(f"data[{i}].probs: expected an object of class names to finite numbers")
        label, probability = row.get("label"), row.get("probability")
        if not isinstance(label, str) or label not in probs:
            raise BadAnswer(f"data[{i}].label: expected one of the classes in probs, got {label!r:.80}")
        if not finite(probability) or probability != probs[label]:
            raise BadAnswer(f"data[{i}].probability: expected probs[{label!r}], got {probability!r:.80}")
        results.append(Label(label, float(probability), {k: float(v) for k, v in probs.items()}))
    return results


def relevance(answer: dict[str, Any], expected: int) -> list[float]:
    scores = []
    for i, row in enumerate(_rows(answer, "cross_encoder", expected)):
        score = row.get("score")
        if not finite(score):
            raise BadAnswer(f"data[{i}].score: expected a finite number, got {score!r:.80}")
        scores.append(float(score))
    return scores


def _rows(answer: dict[str, Any], family: str, expected: int) -> list[dict[str, Any]]:
    """The answer's rows in input order, once its `object` says it is this family's answer (a model of
    another family under the same name is the config's or the server's mistake, never read as this one)."""
    if answer.get("object") != OBJECTS[family]:
        raise BadAnswer(f"object: expected {OBJECTS[family]!r} (a {family} model), got {answer.get('object')!r:.80}")
    return rows_by_index(answer, "data", expected)
