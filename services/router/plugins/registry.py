"""Which class serves each plugin type (router process): the builder the plugin host calls once per
configured plugin, given what plugins share: the store, the decision models (recall embeds through
them) and the config (knowledge bases)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.router.config.plugins import MemoryConfig, PluginConfig, RagConfig, SemanticCacheConfig
from services.router.plugins.hooks import Plugin
from services.router.plugins.memory import Memory
from services.router.plugins.rag import Rag
from services.router.plugins.semantic_cache import SemanticCache
from services.router.plugins.shared import Shared

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
