"""grpc_api/auth.py: a call without a valid API key is refused from its metadata alone, whatever the
method's kind: its request is never read (grpc.aio reads a unary request whole before a unary handler
runs, so the refusal is a request-streaming handler that never iterates)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from services.frontend.grpc_api.auth import Auth

KEY = "k-one"


class _Aborted(Exception):
    pass


class _Context:
    """The port the handler uses: ServicerContext.abort."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise _Aborted


async def _unread() -> AsyncIterator[Any]:
    raise AssertionError("the refused call's request was read")
    yield  # pragma: no cover


async def _passed(details: Any) -> str:
    return "the method's own handler"


def _intercept(method: str, metadata: tuple[tuple[str, str], ...]) -> Any:
    details = SimpleNamespace(method=method, invocation_metadata=metadata)
    return asyncio.run(Auth([KEY]).intercept_service(_passed, details))


@pytest.mark.parametrize("method", ["/fleet.v1.Inference/Generate", "/fleet.v1.Inference/GenerateStream",
                                    "/fleet.v1.RlControl/UpdateWeights", "/fleet.v1.KvEvents/Subscribe",
                                    "/fleet.v1.Control/GetLoads"])
@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("x-api-key", "wrong"),),
                                      (("authorization", "Bearer wrong"), ("x-api-key", KEY))])
def test_a_call_without_a_valid_key_is_refused_unread(method: str, metadata: tuple[tuple[str, str], ...]) -> None:
    handler = _intercept(method, metadata)
    assert handler.request_streaming  # grpc.aio hands it the request stream, unread
    context = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(handler.stream_unary(_unread(), context))
    assert context.status is not None
    code, details = context.status
    assert code == grpc.StatusCode.UNAUTHENTICATED and "Authorization: Bearer <key>" in details


@pytest.mark.parametrize("metadata", [(("authorization", f"Bearer {KEY}"),), (("x-api-key", KEY),)])
def test_a_valid_key_passes_to_the_method(metadata: tuple[tuple[str, str], ...]) -> None:
    assert _intercept("/fleet.v1.Inference/Generate", metadata) == "the method's own handler"


def test_health_is_open() -> None:
    assert _intercept("/grpc.health.v1.Health/Check", ()) == "the method's own handler"
