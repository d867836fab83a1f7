"""What the gRPC services share: a call's failure as its status code (an HTTP-side refusal mapped to
one), the unary handlers' guard, a required field's check, and utility calls on every ready engine rank.
Runs on API server 0's event loop."""
from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, NoReturn, Protocol

import grpc

from services.frontend.engine_client import fanout
from services.frontend.errors import APIError
from services.frontend.generation.frontend_core import FrontendCore

UTILITY_TIMEOUT_S = 60.0  # a utility call with no deadline of its own (the RPC's, when it has one, bounds it)

_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
           403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
           413: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
           503: grpc.StatusCode.UNAVAILABLE}


class CallContext(Protocol):
    """What the handlers use of a call's context: grpc.aio's ServicerContext, or the gRPC port's own call
    (grpc_api/upload_call.py) for a method it serves."""

    def time_remaining(self) -> float | None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...


class Failed(Exception):
    """An RPC's error: its status code and message (the handler aborts the call with them)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_of(http_status: int) -> grpc.StatusCode:
    return _STATUS.get(http_status, grpc.StatusCode.INTERNAL)


def failed(exc: APIError) -> Failed:
    """An HTTP-side refusal as the call's status; its message names the field (HTTP gives it apart)."""
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    return Failed(status_of(exc.status), message)


async def guard(context: CallContext, work: Awaitable[Any]) -> Any:
    """A unary handler's body: its Failed as the call's status."""
    try:
        return await work
    except Failed as exc:
        await context.abort(exc.code, str(exc))


def need(value: str, field: str, what: str) -> None:
    if not value:
        raise Failed(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: must be set ({what})")


class Ranks:
    """Utility calls on every ready rank at once; an error names each rank that failed and why."""

    def __init__(self, core: FrontendCore) -> None:
        self._core = core

    def ready(self) -> list[int]:
        ranks = fanout.ready_ranks(self._core.engines)
        if not ranks:
            raise Failed(grpc.StatusCode.UNAVAILABLE, f"no engine rank is ready: {self._core.engines.not_ready()}")
        return ranks

    async def call(self, context: CallContext, utility: str, frames: Sequence[bytes] = (),
                   **args: Any) -> list[Any]:
        indexes = self.ready()
        left = context.time_remaining()
        timeout = UTILITY_TIMEOUT_S if left is None else max(left, 0.001)
        engines = self._core.engines
        results = await fanout.call_each(engines, indexes, utility, args, timeout, frames)
        if any(isinstance(r, TimeoutError) for r in results):
            raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED, f"{utility}: the engines did not answer within "
                                                              f"{timeout:.1f}s")
        for r in results:
            if isinstance(r, BaseException):
                raise r
        failed = fanout.refusals(engines, indexes, results)
        if failed:
            unsupported = all("Unsupported" in why for _, why in failed)
            raise Failed(grpc.StatusCode.UNIMPLEMENTED if unsupported else grpc.StatusCode.FAILED_PRECONDITION,
                          f"{utility}: {fanout.told(failed)}")
        return [r.result for r in results if fanout.ok(r)]
