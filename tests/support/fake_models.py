"""A fake of the model runtime's port (services/router/runtime/models.py: DecisionModels) for the
decision engine's unit tests: scripted answers per deployment, a record of every call, and hooks that
hold a call until the test lets it go or make it fail."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.router.runtime.models import Classified, Embedded, Label, ModelUnavailable, Reranked

Hook = Callable[[str, str], Awaitable[None]]  # (kind, deployment): awaited before the call answers


def label(top: str, probs: dict[str, float]) -> Label:
    return Label(top, probs[top], probs)


@dataclass
class FakeModels:
    """`vectors`: text -> vector (embed); `labels`: deployment -> Label for any text (classify);
    `relevance`: document -> score (rerank). `hook` runs inside every call first."""

    vectors: dict[str, list[float]] = field(default_factory=dict)
    labels: dict[str, Label] = field(default_factory=dict)
    relevance: dict[str, float] = field(default_factory=dict)
    hook: Hook | None = None
    calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (kind, deployment, texts or documents)
    cancelled: list[str] = field(default_factory=list)  # deployments whose call was cancelled

    async def embed(self, deployment: str, texts: list[str], *, timeout_s: float, truncate: bool = True) -> Embedded:
        await self._enter("embed", deployment, texts)
        return Embedded(f"http://{deployment}", 0.01, [self.vectors[t] for t in texts])

    async def classify(self, deployment: str, texts: list[str], *, timeout_s: float,
                       truncate: bool = True) -> Classified:
        await self._enter("classify", deployment, texts)
        return Classified(f"http://{deployment}", 0.02, [self.labels[deployment] for _ in texts])

    async def rerank(self, deployment: str, query: str, documents: list[str], *, timeout_s: float,
                     truncate: bool = True) -> Reranked:
        await self._enter("rerank", deployment, documents)
        return Reranked(f"http://{deployment}", 0.03, [self.relevance[d] for d in documents])

    async def _enter(self, kind: str, deployment: str, texts: Any) -> None:
        self.calls.append((kind, deployment, list(texts)))
        try:
            if self.hook is not None:
                await self.hook(kind, deployment)
        except asyncio.CancelledError:
            self.cancelled.append(deployment)
            raise


async def never(kind: str, deployment: str) -> None:
    """A worker that never answers, and ignores the timeout it is given."""
    await asyncio.Event().wait()


def failing(message: str) -> Hook:
    async def fail(kind: str, deployment: str) -> None:
        raise ModelUnavailable(message)
    return fail
