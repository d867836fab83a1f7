"""Handshake rules, shared so both sides agree on what is accepted and on what a refusal says."""
from __future__ import annotations

import hmac
from collections.abc import Mapping
from enum import Enum

from protocol.messages import Hello, Reject
from protocol.version import MAJOR, MINOR

# Where engines and frontends both look for the shared handshake token when no flag gives it: the
# environment (a Kubernetes Secret, compose), never the command line, which `ps` shows to every user.
TOKEN_ENV = "ENGINE_AUTH_TOKEN"


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


def auth_token_from(token: str | None, token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The handshake token a process was given: --auth-token, else the content of --auth-token-file
    (surrounding whitespace dropped: files end with a newline), else $ENGINE_AUTH_TOKEN, else None.
    ValueError naming the flag for two sources at once, an unreadable file or an empty token."""
    if token is not None and token_file is not None:
        raise ValueError("--auth-token-file and --auth-token are exclusive: give the token once")
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"--auth-token-file={token_file!r} is invalid: {exc.strerror}") from None
    elif token is None:
        token = environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise ValueError(f"the auth token (--auth-token-file, --auth-token or ${TOKEN_ENV}) is empty")
    return token
