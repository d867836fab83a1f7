"""Which class serves each plugin type (router process): the builder the plugin host calls once per
configured plugin, given what plugins share: the store, the decision models (recall embeds through
them) and the config (knowledge bases)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.router.config import RouterConfig
from services.router.config.plugins import PluginConfig, SemanticCacheConfig
from services.router.plugins.hooks import Plugin
from services.router.plugins.semantic_cache import SemanticCache
from services.router.plugins.store.base import Store
from services.router.runtime.models import DecisionModels


@dataclass(frozen=True, slots=True)
class Shared:
    """What every plugin may use."""
    config: RouterConfig
    store: Store
    models: DecisionModels


# Plugin config type -> its class, called as cls(config, shared).
CLASSES: dict[type, Callable[[Any, Shared], Plugin]] = {
    SemanticCacheConfig: SemanticCache,
}


def builder(shared: Shared) -> Callable[[PluginConfig], Plugin]:
    def build(config: PluginConfig) -> Plugin:
        return CLASSES[type(config)](config, shared)
    return build
