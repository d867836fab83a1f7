"""What every plugin is built with (router process): the config, the opened store, the decision models
(plugins embed through them) and the knowledge bases in use. Its own module so that the plugins and the
registry that builds them both import it, and neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass, field

from services.router.config import RouterConfig
from services.router.plugins.knowledge import KnowledgeBase
from services.router.plugins.store.base import Store
from services.router.runtime.models import DecisionModels


@dataclass(frozen=True, slots=True)
class Shared:
    config: RouterConfig
    store: Store
    models: DecisionModels
    # The knowledge bases in use by name, built by the first rag plugin that recalls from each.
    knowledge: dict[str, KnowledgeBase] = field(default_factory=dict, compare=False)
