"""Value rules for the router config: URLs, regexes, names that must exist or be unique.

Each rule returns a problem message (or None); the loader, run by the router at start, prefixes
it with the key path.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from urllib.parse import urlsplit

from services.router.config.types import REGEX_FLAGS


def url_problem(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.query or parts.fragment):
        return f"expected http(s) URL, got {value!r}"
    return None


def grpc_address_problem(value: str) -> str | None:
    """host:port, the host a name, an IPv4 address or a bracketed IPv6 one; the port 1..65535."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or any(c in host for c in "/[] ") or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"expected host:port (the frontend's --grpc-port), got {value!r}"
    return None


def regex_problem(pattern: str, flags: Iterable[str] = ()) -> str | None:
    bits = 0
    for flag in flags:
        bits |= REGEX_FLAGS.get(flag, 0)
    try:
        re.compile(pattern, bits)
    except re.error as exc:
        return f"invalid regex {pattern!r}: {exc}"
    return None


def unknown_name(name: str, known: Collection[str], what: str, plural: str | None = None) -> str | None:
    """`unknown pool 'bg' (pools: small, big)` when `name` is not in `known`."""
    if name in known:
        return None
    listed = ", ".join(known) if known else "none defined"
    return f"unknown {what} {name!r} ({plural or what + 's'}: {listed})"


def duplicates(names: Sequence[object]) -> list[int]:
    """Indexes of the names that already appeared earlier in the sequence."""
    seen: set[object] = set()
    repeated = []
    for i, name in enumerate(names):
        if name in seen:
            repeated.append(i)
        seen.add(name)
    return repeated


def unknown_key(key: object, allowed: Sequence[str]) -> str:
    message = f"unknown key; allowed: {', '.join(allowed)}"
    close = [a for a in allowed if isinstance(key, str) and _near(key, a)]
    return f"{message} (did you mean {close[0]!r}?)" if close else message


def _near(a: str, b: str) -> bool:
    """One edit apart (insert, delete, substitute or swap two neighbours): a likely typo."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))
