"""Two JSON entry rules for request bodies that a strict decoder refuses (pure functions on the bytes,
for every face that decodes a body; each is called only once the strict decode has failed, so a body
that follows the JSON standard pays nothing for them):

- a lone UTF-16 surrogate escape (`"\\ud800"`, which JavaScript clients send when they cut a string
  inside an emoji) is replaced by U+FFFD, as a lenient UTF-8 decoder replaces a broken sequence;
- `NaN`, `Infinity` and `-Infinity` (which Python's json module writes) are not JSON, and a number past
  a float's range (`1e400`) is no number a request can use: the request is refused, and `non_finite`
  says which field held one, so the refusal can name it.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

# Every backslash escape that matters, left to right: an escaped backslash (so that `\\ud800` stays
# text), a surrogate pair (kept), a high or a low surrogate on its own (replaced).
_HIGH, _LOW = rb"u[dD][89abAB][0-9a-fA-F]{2}", rb"u[dD][c-fC-F][0-9a-fA-F]{2}"
_ESCAPE = re.compile(rb"\\(?:\\|" + _HIGH + rb"(?:\\" + _LOW + rb")?|" + _LOW + rb")")
_LONE = re.compile(rb"\\u[dD][89a-fA-F]")  # a surrogate escape, maybe a lone one
_REPLACEMENT = rb"\ufffd"
_NON_FINITE = re.compile(rb"NaN|Infinity|[eE][+-]?0*\d{3}")  # the last: an exponent that may pass the range


def _replace(m: re.Match[bytes]) -> bytes:
    """A lone surrogate (six bytes) replaced; an escaped backslash or a pair kept."""
    return _REPLACEMENT if len(m.group()) == 6 else m.group()


def lone_surrogates_replaced(body: bytes) -> bytes:
    """`body` with each lone surrogate escape inside its strings made `\\ufffd`; the same object when
    there is none."""
    if not _LONE.search(body):
        return body
    fixed = _ESCAPE.sub(_replace, body)
    return body if fixed == body else fixed


class _Constant:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def non_finite(body: bytes) -> tuple[str, str] | None:
    """(where, which) for the first NaN or Infinity that `body` holds as a value: `where` is the field's
    path as the decoders name fields (`messages[0].content`, "" for the body itself), `which` the
    literal. None when there is none, or when the body is not JSON even with them allowed.
    The caller has checked the body's depth: the walk recurses once per level."""
    if not _NON_FINITE.search(body):
        return None
    try:
        doc = json.loads(body, parse_constant=_Constant, parse_float=_float)
    except (ValueError, RecursionError):
        return None
    return _find(doc, "")


def _float(literal: str) -> float | _Constant:
    value = float(literal)
    return value if math.isfinite(value) else _Constant(literal)


def _find(value: Any, at: str) -> tuple[str, str] | None:
    if isinstance(value, _Constant):
        return at, value.name
    if isinstance(value, dict):
        items: Any = ((f"{at}.{k}" if at else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{at}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _find(item, where)
        if found is not None:
            return found
    return None
