"""Sends requests to engine ranks: the placement's choice, the submit, a second placement after a
draining rank's refusal, a send that found no connection, or a rank lost before it produced anything
for the request, and the abort. Runs on each API server's event loop."""
from __future__ import annotations

import logging

from services.frontend.engine_client.engines import Engine, EngineSet
from services.frontend.engine_client.inflight import InFlight
from services.frontend.engine_client.placement import NoEngine, Placement
from services.frontend.requests.engine_request import EngineRequest

log = logging.getLogger(__name__)


class Submitter:
    """The engines as the request handlers and output processing (its EnginePort) see them."""

    def __init__(self, engines: EngineSet, placement: Placement) -> None:
        self._engines = engines
        self._placement = placement

    def choose(self, request: EngineRequest) -> Engine:
        """The engine for a new request. Raises NoEngine."""
        return self._placement.pick(self._engines.engines, request.prompt_len, request.block_hashes,
                                    pinned=request.request.pinned_rank, request_id=request.request_id)

    def submit(self, engine: Engine, stream: InFlight, request: EngineRequest) -> None:
        self._engines.submit(engine, stream, request.request)

    def place_again(self, stream: InFlight, request: EngineRequest, exclude: set[int]) -> bool:
        """Place it on an engine whose index is not in `exclude`; False when none can take it."""
        engines = [e for e in self._engines.engines if e.index not in exclude]
        try:
            engine = self._placement.pick(engines, stream.prompt_len, request.block_hashes,
                                          request_id=stream.request_id)
        except NoEngine:
            return False
        first = self._engines.engines[stream.engine_index]
        log.info("request %s: rank %d did not start it (%s); placing it on rank %d", stream.request_id, stream.rank,
                 first.condition if not first.accepting else "it started a new session", engine.rank)
        stream.finished = stream.started = False
        self._engines.submit(engine, stream, request.request)
        return True

    def abort(self, stream: InFlight) -> None:
        """Stop a request at its engine; a no-op unless it is still running there."""
        self._engines.abort(stream)
