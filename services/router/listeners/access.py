"""Access control of the router's listeners (router process): a request's API key checked against its
listener's keys by the rule every face shares (edge/api_keys.py: Bearer or x-api-key, constant time)."""
from __future__ import annotations

from collections.abc import Iterable

from edge.api_keys import HOW_TO_SEND, ApiKeys, KeyCheck
from services.router.errors import HTTPError


def authorize(keys: ApiKeys, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Nothing when the listener has no keys or the request carries one of them; else a 401."""
    check = keys.check(headers)
    if check is not KeyCheck.ACCEPTED:
        message = "Incorrect API key provided." if check is KeyCheck.WRONG else f"Missing API key: {HOW_TO_SEND}."
        raise HTTPError(401, message)
