"""Who a request belongs to (router process), for the plugins' isolation: the tenant is a digest of the
API key it presented (never the key itself, which the store must not hold), the user the body's `user`
(Anthropic's `metadata.user_id`) or the `x-router-user` header."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from edge.api_keys import presented_key

USER_HEADER = b"x-router-user"
MAX_USER_CHARS = 256  # a longer `user` is refused (it is a store key)


def tenant_of(keyed: bool, headers: Iterable[tuple[bytes, bytes]]) -> str:
    """A digest of the presented key on a listener with keys; "-" on an open one (everyone is one tenant)."""
    if not keyed:
        return "-"
    return "k" + hashlib.sha256(presented_key(headers)).hexdigest()[:32]


def user_of(request: dict[str, Any], headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The end user the request names, or None. ValueError (naming the field) for a name that is not a
    non-empty string of at most MAX_USER_CHARS characters."""
    user: Any = request.get("user")
    where = "user"
    if user is None:
        metadata = request.get("metadata")
        if isinstance(metadata, dict) and metadata.get("user_id") is not None:
            user, where = metadata["user_id"], "metadata.user_id"
    if user is None:
        for name, value in headers:
            if name == USER_HEADER:
                user, where = value.decode("utf-8", "replace"), USER_HEADER.decode()
                break
    if user is None:
        return None
    if not isinstance(user, str) or not user or len(user) > MAX_USER_CHARS or "\x00" in user:
        raise ValueError(f"{where}: must be a non-empty string of at most {MAX_USER_CHARS} characters "
                         "without NUL")
    return user
