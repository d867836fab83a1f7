"""What the decision engine asks of the model runtime: one call per signal evaluation, answered by one
worker of a deployment. Runs on the router's event loop. The runtime (deployments.py) implements it;
signals see only this port, so unit tests give them a fake."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class ModelUnavailable(RuntimeError):
    """A deployment could not answer in time: no ready worker, every worker full, the worker failed or
    timed out. The message says which and why; the signal becomes unknown, the request goes on. A
    System One call answers with `status`: 429 every worker full, 503 none ready, 504 no answer in time,
    502 a worker failed or answered wrongly, 400 the worker refused the input."""

    def __init__(self, message: str, status: int = 503, *, retry_after_s: int | None = None,
                 refusal: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s  # 429: when to try again (the Retry-After header)
        # 400: what the worker said of the input, without its address: the client's message. `param`: its field.
        self.refusal = refusal
        self.param = param

    @property
    def public_message(self) -> str:
        """What the API answers: the worker's own words for a refused input, else the whole reason."""
        return self.refusal if self.refusal is not None else str(self)


@dataclass(slots=True, frozen=True)
class Answer:
    worker: str  # the replica that answered (its URL)
    latency_s: float  # the call as the router saw it
    prompt_tokens: int = field(default=0, kw_only=True)  # the worker's usage (0 when it gave none)


@dataclass(slots=True, frozen=True)
class Embedded(Answer):
    vectors: list[list[float]]  # one per text, L2-normalized as the model's pooler gives them


@dataclass(slots=True, frozen=True)
class Label:
    label: str  # the top class's name (the checkpoint's id2label)
    probability: float  # its probability
    probs: dict[str, float]  # every class by name


@dataclass(slots=True, frozen=True)
class Classified(Answer):
    results: list[Label]  # one per text


@dataclass(slots=True, frozen=True)
class Reranked(Answer):
    scores: list[float]  # one per document, in document order (the cross-encoder's relevance score)


class DecisionModels(Protocol):
    """Deployments by name. Every call raises ModelUnavailable (never hangs past `timeout_s`) and
    KeyError for a deployment the config does not declare (a config error caught at load).
    `truncate`: a text past the model's context is cut, keeping its end (signals: a long prompt must
    not make them unknown); False: it is the worker's refusal, a 400 (System One answers as asked)."""

    async def embed(self, deployment: str, texts: list[str], *, timeout_s: float,
                    truncate: bool = True) -> Embedded: ...

    async def classify(self, deployment: str, texts: list[str], *, timeout_s: float,
                       truncate: bool = True) -> Classified: ...

    async def rerank(self, deployment: str, query: str, documents: list[str], *, timeout_s: float,
                     truncate: bool = True) -> Reranked: ...
