"""Which class serves each plugin type (router process): the builder the plugin host calls once per
configured plugin, given what plugins share: the store, the decision models (recall embeds through
them) and the config (knowledge bases)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.router.config import RouterConfig
from services.router.config.plugins import MemoryConfig, PluginConfig, RagConfig, SemanticCacheConfig
from services.router.plugins.hooks import Plugin
from services.router.plugins.knowledge import KnowledgeBase
from services.router.plugins.memory import Memory
from services.router.plugins.rag import Rag
from services.router.plugins.semantic_cache import SemanticCache
from services.router.plugins.store.base import Store
from services.router.runtime.models import DecisionModels


@dataclass(frozen=True, slots=True)
class Shared:
    """What every plugin may use."""
    config: RouterConfig
    store: Store
    models: DecisionModels
    # The knowledge bases in use by name, built by the first rag plugin that recalls from each.
    knowledge: dict[str, KnowledgeBase] = field(default_factory=dict, compare=False)


# Plugin config type -> its class, called as cls(config, shared).
CLASSES: dict[type, Callable[[Any, Shared], Plugin]] = {
    SemanticCacheConfig: SemanticCache,
    MemoryConfig: Memory,
    RagConfig: Rag,
}


def builder(shared: Shared) -> Callable[[PluginConfig], Plugin]:
    def build(config: PluginConfig) -> Plugin:
        return CLASSES[type(config)](config, shared)
    return build
