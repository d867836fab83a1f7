"""lora.Adapters against engines faked at the EngineSet port (utility calls, ranks, on_ready): what
is served, how often the engines are asked, a load that one rank refuses, a reload on a new session."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from protocol import UtilityResult
from services.frontend.engine_client import lora
from services.frontend.engine_client.lora import Adapters
from services.frontend.errors import APIError


@dataclass
class Rank:
    index: int
    rank: int
    state: str = "ready"
    epoch: str = "e1"
    reloading: bool = False
    loras: dict[str, str] = field(default_factory=dict)
    refuse: str | None = None


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Let the registry's background work run until `condition` holds (a failure past the deadline)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


class FakeEngines:
    def __init__(self, ranks: int) -> None:
        self.engines = [Rank(i, i) for i in range(ranks)]
        self.on_ready: list[Any] = []
        self.calls: list[tuple[int, str]] = []
        self.changed = asyncio.Event()

    def not_ready(self) -> dict[int, str]:
        return {e.rank: e.state for e in self.engines if e.state != "ready"}

    async def utility(self, index: int, utility: str, args: dict[str, Any] | None = None,
                      timeout_s: float = 10.0, frames: Sequence[bytes] = ()) -> UtilityResult:
        self.calls.append((index, utility))
        await asyncio.sleep(0)
        e, args = self.engines[index], args or {}
        if utility == "list_loras":
            return UtilityResult(0, True, sorted(e.loras))
        if utility == "add_lora":
            if e.refuse is not None:
                return UtilityResult(0, False, error=e.refuse)
            if e.loras.get(args["name"]) == args["path"]:
                return UtilityResult(0, True, False)
            e.loras[args["name"]] = args["path"]
            return UtilityResult(0, True, True)
        assert utility == "remove_lora"
        return UtilityResult(0, True, e.loras.pop(args["name"], None) is not None)


def _adapters(ranks: int = 2) -> tuple[Adapters, FakeEngines]:
    engines = FakeEngines(ranks)
    return Adapters(engines, "base"), engines  # type: ignore[arg-type]


def test_a_name_is_served_when_every_ready_rank_lists_it() -> None:
    async def go() -> None:
        a, engines = _adapters()
        engines.engines[0].loras = {"x": "/x", "y": "/y"}
        engines.engines[1].loras = {"x": "/x"}
        await a.check("x")
        with pytest.raises(APIError, match="The model `y` does not exist") as err:
            await a.check("y")
        assert err.value.status == 404 and err.value.param == "model"
        engines.engines[1].state = "dead"  # a rank that is not ready is not asked
        a._looked_at = -lora.REFRESH_S
        await a.check("y")
    asyncio.run(go())


def test_unknown_names_ask_the_engines_at_most_once_a_refresh_period(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        a, engines = _adapters()
        await asyncio.gather(*(a.check("nope") for _ in range(20)), return_exceptions=True)
        assert len(engines.calls) == 2  # one look, shared: a list_loras per rank
        for _ in range(20):
            with pytest.raises(APIError):
                await a.check("nope")
        assert len(engines.calls) == 2
        monkeypatch.setattr(lora, "REFRESH_S", 0.0)
        with pytest.raises(APIError):
            await a.check("nope")
        assert len(engines.calls) == 4
    asyncio.run(go())


def test_a_known_name_is_answered_at_once_and_looked_at_again_behind_it(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        a, engines = _adapters(1)
        engines.engines[0].loras = {"x": "/x"}
        await a.check("x")
        monkeypatch.setattr(lora, "REFRESH_S", 0.0)
        del engines.engines[0].loras["x"]  # unloaded through another process
        await a.check("x")  # still served from what this process saw
        await _until(lambda: "x" not in a.served)  # the look taken behind it
        with pytest.raises(APIError):
            await a.check("x")
    asyncio.run(go())


def test_a_load_one_rank_refuses_is_dropped_by_the_others_and_names_the_refusal() -> None:
    async def go() -> None:
        a, engines = _adapters()
        engines.engines[1].refuse = "add_lora.path '/bad': no adapter_config.json there"
        with pytest.raises(APIError, match="engine rank 1: add_lora.path '/bad'") as err:
            await a.load("x", "/bad")
        assert err.value.status == 400 and err.value.param == "lora_path"
        assert engines.engines[0].loras == {}
        engines.engines[1].refuse = None
        await a.load("x", "/good")
        assert all(e.loras == {"x": "/good"} for e in engines.engines)
        with pytest.raises(APIError, match="has already been loaded"):
            await a.load("x", "/good")
        with pytest.raises(APIError, match="base model's name"):
            await a.load("base", "/good")
    asyncio.run(go())


def test_unload_is_a_404_when_no_rank_had_it() -> None:
    async def go() -> None:
        a, engines = _adapters()
        await a.load("x", "/x")
        await a.unload("x")
        assert "x" not in a.served and not a.paths
        with pytest.raises(APIError, match="cannot be found") as err:
            await a.unload("x")
        assert err.value.status == 404
    asyncio.run(go())


def test_a_rank_with_a_new_session_gets_what_this_process_loaded() -> None:
    async def go() -> None:
        a, engines = _adapters()
        await a.load("x", "/x")
        engines.engines[1].loras = {}  # restarted: a new session holds only its --lora-modules
        for joined in engines.on_ready:
            joined(engines.engines[1])
        await _until(lambda: engines.engines[1].loras == {"x": "/x"})
    asyncio.run(go())


def test_no_ready_rank_is_a_503_for_load_and_unload() -> None:
    async def go() -> None:
        a, engines = _adapters(1)
        engines.engines[0].state = "connecting"
        for call in (a.load("x", "/x"), a.unload("x")):
            with pytest.raises(APIError, match="no engine rank is ready") as err:
                await call
            assert err.value.status == 503
    asyncio.run(go())


def test_a_cancelled_caller_does_not_leave_the_look_stuck() -> None:
    async def go() -> None:
        a, engines = _adapters(1)
        caller = asyncio.get_running_loop().create_task(a.check("x"))
        await asyncio.sleep(0)  # the look has started
        caller.cancel()
        await _until(lambda: a._look is None)
        engines.engines[0].loras = {"x": "/x"}
        a._looked_at = -lora.REFRESH_S
        await a.check("x")  # a new look finds it
    asyncio.run(go())


def test_a_reloading_rank_takes_no_requests_and_is_not_looked_at_until_its_adapters_are_back() -> None:
    async def go() -> None:
        a, engines = _adapters()
        await a.load("x", "/x")
        rank = engines.engines[1]
        rank.loras, rank.epoch = {}, "e2"  # a new session
        for joined in engines.on_ready:
            joined(rank)
        assert rank.reloading
        await a.refresh()  # the restarted rank's short list does not drop the adapter for every rank
        assert "x" in a.served and a.paths == {"x": "/x"}
        await _until(lambda: not rank.reloading)
        assert rank.loras == {"x": "/x"} and engines.changed.is_set()
    asyncio.run(go())


def test_what_no_rank_lists_any_more_is_not_loaded_again() -> None:
    async def go() -> None:
        a, engines = _adapters()
        await a.load("x", "/x")
        for e in engines.engines:  # unloaded through another process
            e.loras = {}
        await a.refresh()
        assert a.paths == {}
        engines.engines[1].epoch = "e2"
        for joined in engines.on_ready:
            joined(engines.engines[1])
        assert not engines.engines[1].reloading
    asyncio.run(go())


def test_no_ready_rank_to_ask_is_a_503_not_a_404() -> None:
    async def go() -> None:
        a, engines = _adapters(1)
        engines.engines[0].state = "connecting"
        with pytest.raises(APIError, match="no engine rank is ready to serve model 'x'") as err:
            await a.check("x")
        assert err.value.status == 503
    asyncio.run(go())


def test_empty_names_and_paths_are_refused() -> None:
    async def go() -> None:
        a, _ = _adapters(1)
        calls = ((a.load("", "/x"), "lora_name"), (a.load("x", ""), "lora_path"), (a.unload(""), "lora_name"))
        for call, param in calls:
            with pytest.raises(APIError, match="must be provided") as err:
                await call
            assert (err.value.status, err.value.param) == (400, param)
    asyncio.run(go())
