"""LoRA adapters served by name, as vLLM serves them: a request whose `model` is an adapter's name runs
with that adapter on the base model.

The engines hold the adapters (loaded by their --lora-modules at start, or at run time through
/v1/load_lora_adapter or gRPC's LoadLora on any API server of any frontend), so the engines' lists are
the truth. This process keeps the names every ready rank listed at its last look, and looks again
(list_loras on each ready rank) when a request names a model it does not know, at most once per
REFRESH_S (an unknown name costs a dictionary miss, not an engine round trip, past the first), and
behind requests that name a known one once that look is older than REFRESH_S.

What this process loaded itself it remembers by path, and it loads those again on a rank that comes
back with a new session (a restarted rank has only its --lora-modules); add_lora of the same name and
path is a no-op at the engine, so API servers and frontends doing the same at once agree. Until that
reload ends the rank takes no requests (Engine.reloading) and its list is not looked at; a path whose
adapter no other ready rank lists any more (unloaded through another process) is forgotten, not
loaded again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

from protocol import UtilityResult
from services.frontend.engine_client import fanout
from services.frontend.errors import APIError

if TYPE_CHECKING:
    from services.frontend.engine_client.engines import Engine, EngineSet

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # the least time between two looks at the engines' lists prompted by unknown names
CALL_TIMEOUT_S = 5.0  # list_loras and remove_lora: answered between two engine steps
LOAD_TIMEOUT_S = 120.0  # add_lora: vLLM reads the adapter's files


class UnloadLoraBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's /v1/unload_lora_adapter body."""

    lora_name: str


class LoadLoraBody(UnloadLoraBody, kw_only=True, forbid_unknown_fields=True):
    """vLLM's /v1/load_lora_adapter body."""

    lora_path: str
    load_inplace: bool = False  # true (new weights under a loaded name) is refused: unload, then load


class Adapters:
    def __init__(self, engines: EngineSet, base: str) -> None:
        self._engines = engines
        self._base = base
        self.served: set[str] = set()  # what every ready rank listed at the last look
        self.paths: dict[str, str] = {}  # what this process loaded, by name
        self._looked_at = -REFRESH_S
        self._none_ready = False  # the last look found no ready rank to ask
        self._look: asyncio.Task[set[str]] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        engines.on_ready.append(self._rank_joined)

    async def check(self, name: str, param: str = "model") -> None:
        """Raises the 404 vLLM gives for a model it does not serve (`param`: the field that named it; a gRPC
        request's is lora_name), unless `name` is a served adapter; a 503 when no rank could be asked. A
        known name is answered at once, and a look older than REFRESH_S is taken again behind it (so one
        unloaded elsewhere is dropped within about a second); an unknown one waits for a fresh look."""
        stale = time.monotonic() - self._looked_at >= REFRESH_S
        if name in self.served:
            if stale and self._look is None:
                self._behind(self.refresh())
            return
        if stale:
            await self.refresh()
        if name in self.served:
            return
        if self._none_ready:
            raise APIError(503, f"no engine rank is ready to serve {param} {name!r}: {self._engines.not_ready()}")
        if param == "model":
            raise no_such_model(name)
        raise APIError(404, f"{param} {name!r}: no such LoRA adapter is loaded on every ready engine rank; "
                            f"loaded: {sorted(self.served)}", param=param)

    async def refresh(self, max_age_s: float = 0.0) -> set[str]:
        """The engines' lists, read now unless the last look is younger than `max_age_s` (one look at a
        time: callers that come meanwhile share it, and one that is cancelled does not end it)."""
        if max_age_s and time.monotonic() - self._looked_at < max_age_s:
            return self.served
        if self._look is None:
            look = self._look = asyncio.get_running_loop().create_task(self._read())
            look.add_done_callback(self._looked)
        return await asyncio.shield(self._look)

    def _looked(self, look: asyncio.Task[set[str]]) -> None:
        if self._look is look:
            self._look = None
        if not look.cancelled() and look.exception() is not None:
            log.error("looking at the engines' LoRA adapters failed: %r", look.exception())

    async def _read(self) -> set[str]:
        # A rank getting this process's adapters again is not asked: its list is short until then.
        ranks = [e.index for e in self._engines.engines if e.state == "ready" and not e.reloading]
        results = await self._on(ranks, "list_loras", {}, CALL_TIMEOUT_S)
        lists = [set(r.result) for r in results if fanout.ok(r)]
        if len(lists) < len(ranks):
            log.warning("list_loras failed on %s", self._refusals(ranks, results))
        self.served = set.intersection(*lists) if lists else set()
        if lists:  # what no rank lists any more was unloaded (through another process): not loaded again
            listed = set.union(*lists)
            for name in [n for n in self.paths if n not in listed]:
                log.info("lora adapter %r: no engine rank lists it any more; not loaded again", name)
                del self.paths[name]
        self._none_ready = not ranks
        self._looked_at = time.monotonic()
        return self.served

    async def load(self, name: str, path: str) -> None:
        """add_lora on every ready rank; if any refuses, the ranks that took it drop it again and the
        error names each refusal (a 400: the path or the adapter is at fault)."""
        if not name or not path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                           param="lora_name" if not name else "lora_path")
        if name == self._base:
            raise APIError(400, f"lora_name {name!r} is the base model's name", param="lora_name")
        if name in await self.refresh():
            raise APIError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        ranks = self._ready("load")
        results = await self._on(ranks, "add_lora", {"name": name, "path": path}, LOAD_TIMEOUT_S)
        refusals = self._refusals(ranks, results)
        if refusals:
            took = [i for i, r in zip(ranks, results, strict=True) if fanout.ok(r) and r.result is True]
            await self._on(took, "remove_lora", {"name": name}, CALL_TIMEOUT_S)
            raise APIError(400, f"lora adapter {name!r} from {path!r} failed to load: {refusals}", param="lora_path")
        self.paths[name] = path
        self.served.add(name)
        log.info("lora adapter %r loaded from %s on %d rank(s)", name, path, len(ranks))

    async def unload(self, name: str) -> None:
        """remove_lora on every ready rank; a 404 when none had it."""
        if not name:
            raise APIError(400, "'lora_name' must be provided.", param="lora_name")
        ranks = self._ready("unload")
        results = await self._on(ranks, "remove_lora", {"name": name}, CALL_TIMEOUT_S)
        self.paths.pop(name, None)
        self.served.discard(name)
        refusals = self._refusals(ranks, results)
        if refusals:
            raise APIError(400, f"lora adapter {name!r} failed to unload: {refusals}", param="lora_name")
        if not any(fanout.ok(r) and r.result is True for r in results):
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name")
        log.info("lora adapter %r unloaded from %d rank(s)", name, len(ranks))

    async def _on(self, ranks: list[int], utility: str, args: dict[str, Any],
                  timeout_s: float) -> list[UtilityResult | BaseException]:
        """One utility call on each of `ranks` (indexes) at once; a rank's error or time-out as its result."""
        return await fanout.call_each(self._engines, ranks, utility, args, timeout_s)

    def _refusals(self, ranks: list[int], results: list[UtilityResult | BaseException]) -> str:
        """Each rank that did not answer ok, and why; empty when all did."""
        return fanout.told(fanout.refusals(self._engines, ranks, results))

    def _ready(self, what: str) -> list[int]:
        ranks = fanout.ready_ranks(self._engines)
        if not ranks:
            raise APIError(503, f"cannot {what} a lora adapter: no engine rank is ready: {self._engines.not_ready()}")
        return ranks

    def _rank_joined(self, engine: Engine) -> None:
        """A rank with a new session: what this process loaded goes there again, before it takes requests."""
        if self.paths:
            engine.reloading = True
            self._behind(self._reload(engine, dict(self.paths)))

    async def _reload(self, engine: Engine, paths: dict[str, str]) -> None:
        epoch = engine.epoch
        try:
            for name, path in paths.items():
                if engine.epoch != epoch:  # restarted again meanwhile: that session's own reload runs
                    return
                try:
                    result = await self._engines.utility(engine.index, "add_lora", {"name": name, "path": path},
                                                         LOAD_TIMEOUT_S)
                except TimeoutError:
                    log.error("lora adapter %r: engine rank %d did not answer add_lora in %.0fs", name, engine.rank,
                              LOAD_TIMEOUT_S)
                    continue
                if result.ok:
                    log.info("lora adapter %r loaded again on engine rank %d (new session)", name, engine.rank)
                else:
                    log.error("lora adapter %r could not be loaded again on engine rank %d: %s", name, engine.rank,
                              result.error)
        finally:
            if engine.epoch == epoch:
                engine.reloading = False
                self._engines.changed.set()

    def _behind(self, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` as a task of its own, kept until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def no_such_model(name: str) -> APIError:
    """vLLM's answer to a `model` it does not serve."""
    return APIError(404, f"The model `{name}` does not exist.", param="model")

