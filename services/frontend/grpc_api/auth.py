"""The gRPC services' API-key check: every method but the health service's needs one of the HTTP API
keys (--api-key), from `authorization: Bearer <key>` or `x-api-key` metadata, compared in constant
time; probes send no keys."""
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
        return _refusal(details.method)


def _refusal(method: str) -> Any:
    """A handler that refuses the call: UNAUTHENTICATED, of the method's own kind."""
    message = f"a valid API key is required: {HOW_TO_SEND} metadata"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover

    if method.endswith(("/GenerateStream", "/Subscribe")):
        return grpc.unary_stream_rpc_method_handler(streaming)
    if method.endswith("/UpdateWeights"):
        return grpc.stream_unary_rpc_method_handler(unary)
    return grpc.unary_unary_rpc_method_handler(unary)
