"""Every plugin of the config, built once at start, and the hooks run for one request (router process):
request hooks in the decision's order, each bounded by its `timeout_s`; the first that answers ends
the chain; response hooks in the background once the answer went out. A plugin whose store or model
fails is skipped (the request goes on) unless it fails closed (503)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from services.router.config import EntryConfig, RouterConfig
from services.router.config.plugins import PluginConfig
from services.router.metrics import RouterMetrics
from services.router.plugins.answer import Answer
from services.router.plugins.hooks import Exchange, Plugin, PluginRefusal
from services.router.plugins.store.base import StoreRefused, StoreUnavailable
from services.router.runtime.models import ModelUnavailable

log = logging.getLogger("router")
# What a plugin's hook may fail with, short of a bug: its store, its model, its time, or an input the store
# cannot hold (an embedder whose vectors are wider than the store takes: every request's, until fixed).
FAILURES = (StoreUnavailable, StoreRefused, ModelUnavailable, TimeoutError)
Chain = tuple[tuple[PluginConfig, Plugin], ...]  # what runs for one request: each plugin with its config


class PluginHost:
    def __init__(self, config: RouterConfig, build: Callable[[PluginConfig], Plugin],
                 metrics: RouterMetrics) -> None:
        """`build`: one plugin from its config (plugins/registry.py, given the store and the models)."""
        self.metrics = metrics
        self._plugins: dict[PluginConfig, Plugin] = {}
        for entry in config.entries.values():
            for plugins in (entry.plugins, *(rule.plugins or () for rule in entry.decisions)):
                for plugin in plugins:
                    if plugin not in self._plugins:
                        self._plugins[plugin] = build(plugin)
        self._background: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        return bool(self._plugins)

    def plugins_for(self, entry: EntryConfig, decision: str, matched_default: bool) -> Chain:
        return tuple((c, self._plugins[c]) for c in entry.plugins_of(decision, matched_default))

    async def request(self, plugins: Chain,
                      exchange: Exchange) -> tuple[dict[str, Any] | None, int]:
        """A whole completion that answers the request (and how many plugins' request hooks ran, the
        one that answered last), or (None, all of them). PluginRefusal from a plugin that fails closed."""
        for i, (config, plugin) in enumerate(plugins):
            started = time.perf_counter()
            try:
                async with asyncio.timeout(config.timeout_s):
                    answer = await plugin.request(exchange)
            except FAILURES as exc:
                reason = f"no answer within {config.timeout_s}s" if isinstance(exc, TimeoutError) else str(exc)
                self.metrics.plugin_outcomes.labels(exchange.entry, plugin.name, "error").inc()
                if isinstance(exc, StoreUnavailable):
                    self.metrics.store_errors.labels(plugin.name).inc()
                if getattr(config, "on_store_error", "open") == "closed":
                    raise PluginRefusal(503, f"plugin {plugin.name} is unavailable ({reason}); "
                                             "it is configured to refuse requests then") from None
                log.warning("plugin %s skipped for entry %s: %s", plugin.name, exchange.entry, reason)
                continue
            finally:
                self.metrics.plugin_latency.labels(plugin.name).observe(time.perf_counter() - started)
            outcome = exchange.notes.get(f"{plugin.name}.outcome")
            if isinstance(outcome, str):
                self.metrics.plugin_outcomes.labels(exchange.entry, plugin.name, outcome).inc()
            if answer is not None:
                return answer, i + 1
        return None, len(plugins)

    def respond(self, plugins: Chain, exchange: Exchange,
                answer: Answer | None, answered_by: str | None) -> None:
        """Each plugin's response hook, in the background."""
        for _, plugin in plugins:
            task = asyncio.get_running_loop().create_task(self._respond(plugin, exchange, answer, answered_by))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _respond(self, plugin: Plugin, exchange: Exchange, answer: Answer | None,
                       answered_by: str | None) -> None:
        try:
            await plugin.response(exchange, answer, answered_by=answered_by)
        except FAILURES as exc:
            if isinstance(exc, StoreUnavailable):
                self.metrics.store_errors.labels(plugin.name).inc()
            log.warning("plugin %s: response hook for entry %s failed: %s", plugin.name, exchange.entry, exc)
        except Exception:  # a bug in one hook must not go unseen, nor reach the client, who has its answer
            log.exception("plugin %s: response hook failed", plugin.name)

    async def start(self) -> None:
        """Each plugin's start (a knowledge base indexed), if it has one."""
        for plugin in self._plugins.values():
            start = getattr(plugin, "start", None)
            if start is not None:
                await start()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Response hooks in flight finished (up to `timeout_s`), then each plugin's stop."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)
        for plugin in self._plugins.values():
            stop = getattr(plugin, "stop", None)
            if stop is not None:
                await stop()

    async def drain(self) -> None:
        """Wait for the response hooks in flight (tests: what a hook stored is there to read)."""
        while self._background:
            await asyncio.wait(set(self._background))
