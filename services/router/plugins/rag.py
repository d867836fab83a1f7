"""The rag plugin (router process): at the request hook, the chunks of its knowledge base nearest to the
last user turn are given to the model in a system message, each with its source, within a token
budget; the response names the sources used in `x-router-rag-sources`."""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from services.router.config.plugins import RagConfig
from services.router.plugins.answer import Answer
from services.router.plugins.hooks import Exchange
from services.router.plugins.knowledge import Chunk, KnowledgeBase
from services.router.plugins.recall import decoded, give, recall_query
from services.router.plugins.shared import Shared

SOURCES_HEADER = b"x-router-rag-sources"
PREAMBLE = ("Excerpts from the knowledge base {name!r} that may help answer, most relevant first, each after "
            "its source in brackets. Cite the sources you use.")


class Rag:
    name = "rag"

    def __init__(self, config: RagConfig, shared: Shared) -> None:
        self.config = config
        knowledge = shared.config.knowledge[config.knowledge]
        base = shared.knowledge.get(knowledge.name)
        if base is None:
            base = shared.knowledge[knowledge.name] = KnowledgeBase(knowledge, shared.store, shared.models)
        self.base = base
        self.store = shared.store
        self.models = shared.models
        self._preamble = PREAMBLE.format(name=knowledge.name)

    async def start(self) -> None:
        await self.base.start()

    async def stop(self) -> None:
        await self.base.stop()

    async def request(self, exchange: Exchange) -> dict[str, Any] | None:
        outcome = f"{self.name}.outcome"
        query = recall_query(exchange, outcome)
        if query is None:
            return None
        messages, text = query
        knowledge = self.base.config
        embedded = await self.models.embed(knowledge.embedder, [text], timeout_s=self.config.timeout_s)
        found = await self.store.nearest("chunk", knowledge.name, tuple(embedded.vectors[0]), self.config.top_k,
                                         self.config.min_similarity)
        chunks = decoded(found, Chunk)
        used = give(exchange, outcome, messages, self._preamble,
                    [f"[{c.path}#{c.ordinal}]\n{c.text}" for c in chunks], self.config.max_tokens)
        if used:
            sources = ",".join(f"{quote(c.path, safe='/')}#{c.ordinal}" for c in chunks[:used])
            exchange.headers.append((SOURCES_HEADER, sources.encode("ascii")))
        return None

    async def response(self, exchange: Exchange, answer: Answer | None, *, answered_by: str | None) -> None:
        """Nothing to keep: the knowledge base changes with its files, not with answers."""
