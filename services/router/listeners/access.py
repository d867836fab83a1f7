"""Access control of the router's listeners (router process): a request's API key, from
`Authorization: Bearer` or `x-api-key`, checked against its listener's keys in constant time."""
from __future__ import annotations

import hmac
from collections.abc import Iterable

from services.router.errors import HTTPError


def authorize(keys: tuple[bytes, ...], headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Nothing when the listener has no keys or the request carries one of them; else a 401."""
    if not keys:
        return
    given = b""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            given = value[7:].strip()
        elif name == b"x-api-key" and not given:
            given = value.strip()
    ok = False
    for key in keys:  # every key compared, in constant time each: no early exit to time
        ok |= hmac.compare_digest(given, key)
    if not ok:
        message = ("Incorrect API key provided." if given else
                   "Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`.")
        raise HTTPError(401, message, code="invalid_api_key")
