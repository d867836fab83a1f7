"""Handshake rules, shared so both sides agree on what is accepted and on what a refusal says."""
from __future__ import annotations

import hmac
from enum import Enum

from protocol.messages import Hello, Reject
from protocol.version import MAJOR, MINOR


class RejectCode(str, Enum):
    VERSION = "version_mismatch"
    AUTH = "unauthorized"
    DRAINING = "draining"
    MALFORMED = "malformed"
    EXPIRED = "expired"  # the peer went silent past its deadline; its requests were aborted


def make_hello(frontend_id: str, auth_token: str | None = None) -> Hello:
    # Imported here so `python -m protocol.schema` does not find itself half-imported via the package.
    from protocol.schema import current_fingerprint

    return Hello(MAJOR, MINOR, current_fingerprint(), frontend_id, auth_token)


def check_hello(hello: Hello, *, auth_token: str | None, draining: bool) -> Reject | None:
    """None if the engine should answer Ready, else the Reject to send."""
    if hello.major != MAJOR:
        return version_reject(hello.major, hello.minor)
    if auth_token is not None and not hmac.compare_digest(
        (hello.auth_token or "").encode(), auth_token.encode()
    ):
        return Reject(RejectCode.AUTH.value, "engine auth token missing or wrong")
    if draining:
        return Reject(RejectCode.DRAINING.value, "engine is draining (shutting down); use another rank")
    return None


def version_reject(major: int, minor: int) -> Reject:
    """Reject for a Hello whose header already shows a foreign major (its body may not even parse)."""
    return Reject(
        RejectCode.VERSION.value,
        f"protocol major mismatch: frontend speaks {major}.{minor}, engine speaks {MAJOR}.{MINOR}; "
        "upgrade one side so the majors match",
    )
