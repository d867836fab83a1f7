"""Calls that name a concrete chat pool a listener publishes (`listeners[].pools`), in the router process:
the Choice that sends such a request straight to that pool, with no signals and no decisions; the
pool's own `model` is what goes upstream, as for any routed request."""
from __future__ import annotations

from typing import Any

from services.router.config import EntryConfig, ListenerConfig, RouterConfig
from services.router.decision.decisions import Decision, NoEligibleDecision
from services.router.decision.engine import Choice

DIRECT = "direct"  # the decision a direct call reports (x-router-decision, explain)


class DirectPools:
    """The pools each listener publishes by name, each with its one-pool recipe built once at start."""

    def __init__(self, config: RouterConfig) -> None:
        self._pools = config.pools
        published = {name for listener in config.listeners for name in listener.pools}
        # A direct call's entry is the pool itself: the name x-router-entry and the metrics report.
        self._entries = {name: EntryConfig(name, (name,)) for name in published}
        self._decisions = {name: Decision(DIRECT, (name,), False) for name in published}

    def choose(self, listener: ListenerConfig, model: Any, text: str, output: str = "text") -> Choice | None:
        """The Choice of a request whose `model` is a pool that `listener` publishes; None when it is not
        one. NoEligibleDecision when that pool does not declare the `output` the request needs (a chat
        call naming an image pool, an images call naming a text pool)."""
        if not isinstance(model, str) or model not in listener.pools:
            return None
        if output not in self._pools[model].outputs:
            raise NoEligibleDecision(model)
        return Choice(self._entries[model], text, {}, self._decisions[model], (model,))
