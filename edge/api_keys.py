"""The API-key rule of every face (the frontend's HTTP and gRPC, the router's listeners): a client
presents its key as `Authorization: Bearer <key>` or as `x-api-key: <key>` (the Anthropic SDK's header),
the Bearer one winning when both are sent; every accepted key is compared in constant time, all of them,
so the time taken does not say which one matched or how much of it did."""
from __future__ import annotations

import hmac
from collections.abc import Iterable
from enum import Enum

# What a refusal tells the client to do, in every face's 401 (or UNAUTHENTICATED) message.
HOW_TO_SEND = "send it as `Authorization: Bearer <key>` or `x-api-key: <key>`"


class KeyCheck(Enum):
    ACCEPTED = "accepted"
    MISSING = "missing"  # no key presented in either form
    WRONG = "wrong"  # a key presented, not one of the accepted ones


def presented_key(headers: Iterable[tuple[bytes | str, bytes | str]]) -> bytes:
    """The key a request presents (b"" for none): the Bearer token of `authorization`, else `x-api-key`.
    `headers`: (lower-case name, value) pairs, bytes (ASGI) or str (gRPC metadata); other headers pass."""
    bearer = other = b""
    for name, value in headers:
        if name in (b"authorization", "authorization"):
            raw = value if isinstance(value, bytes) else value.encode()
            if raw[:7].lower() == b"bearer ":
                bearer = raw[7:].strip()
        elif name in (b"x-api-key", "x-api-key") and not other:
            other = (value if isinstance(value, bytes) else value.encode()).strip()
    return bearer or other


class ApiKeys:
    """The keys one face accepts. With none configured every request is accepted (`bool(keys)` is false)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[str | bytes]) -> None:
        self._keys = tuple(k if isinstance(k, bytes) else k.encode() for k in keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def check(self, headers: Iterable[tuple[bytes | str, bytes | str]]) -> KeyCheck:
        if not self._keys:
            return KeyCheck.ACCEPTED
        given = presented_key(headers)
        ok = False
        for key in self._keys:  # every key compared, each in constant time: no early exit to time
            ok |= hmac.compare_digest(given, key)
        if ok:
            return KeyCheck.ACCEPTED
        return KeyCheck.WRONG if given else KeyCheck.MISSING
