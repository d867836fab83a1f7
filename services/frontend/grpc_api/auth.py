"""The gRPC services' API-key check: every method but the health service's needs one of the HTTP API
keys (--api-key), from `authorization: Bearer <key>` or `x-api-key` metadata, compared in constant
time; probes send no keys. A call without one is refused from its metadata alone: its message is
never read."""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from edge.api_keys import HOW_TO_SEND, ApiKeys, KeyCheck

_OPEN = ("/grpc.health.v1.Health/",)


class Auth(grpc.aio.ServerInterceptor):
    """Every method but the health service's needs one of the API keys (constant-time compare)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = ApiKeys(keys)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        if (details.method.startswith(_OPEN)
                or self._keys.check(details.invocation_metadata or ()) is KeyCheck.ACCEPTED):
            return await continuation(details)
        return REFUSAL


MESSAGE = f"a valid API key is required: {HOW_TO_SEND} metadata"


async def _refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)


# The refusal, UNAUTHENTICATED, of a call of any kind, without reading its request. grpc.aio reads a unary
# request whole (up to the server's receive limit) before it calls a unary handler, so this handler is a
# request-streaming one that never iterates: on the wire every kind is one HTTP/2 stream, and the status
# goes out before any response message would, so a unary or server-streaming caller sees the same status.
REFUSAL = grpc.stream_unary_rpc_method_handler(_refuse)
