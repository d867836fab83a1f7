"""How deeply a JSON body nests, checked on its bytes before it is decoded (a pure function: each
frontend API server and the router call it on every body they read).

msgspec decodes nesting as deep as Python's recursion limit allows (~1,000) and then raises
RecursionError; the code after it (the tool-schema check, the chat template, re-encoding) recurses too.
So a body nesting more than MAX_DEPTH arrays and objects is refused before any of that runs. The scan
is built of bytes methods that run in C (count, replace, translate, split): `bench/json_depth.py`
measures it beside the decode it guards.
"""
from __future__ import annotations

from itertools import accumulate

MAX_DEPTH = 64  # arrays and objects, the body itself counting 1; tool schemas rarely pass 10
_SCAN = 1 << 13  # brackets summed per step of the exact scan
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # depth does not care which bracket it is
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"')
_STEP = [0] * 256
_STEP[ord("[")], _STEP[ord("]")] = 1, -1


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether `body` nests arrays and objects more than `limit` deep, brackets inside strings not
    counting. Exact for valid JSON; for invalid JSON any answer will do (the decoder refuses it)."""
    if body.count(b"[") + body.count(b"{") <= limit:  # most bodies: too few brackets to nest that deep
        return False
    if b'\\"' in body:  # no escaped quote then: every quote opens or closes a string
        # An escaped backslash cannot escape what follows it; without them, a backslash before a quote
        # escapes it. What a backslash escapes otherwise (n, t, u...) is neither a quote nor a bracket.
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Keep only brackets (of one kind) and quotes. Two adjacent quotes enclose or separate no bracket,
    # so dropping them leaves every bracket as much inside or outside a string as it was.
    s = body.translate(_ONE_KIND, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in s:
        s = b"".join(s.split(b'"')[::2])  # what lies between the 2nth and (2n+1)th quotes is in a string
    # Each pass takes the innermost pairs away: one level off everywhere. Bodies nest wide, not deep,
    # so a few passes leave little; a deep and narrow remainder is scanned exactly.
    while s.count(b"[") > limit:
        if limit == 0:  # a bracket is left: one level more
            return True
        inner = s.replace(b"[]", b"")
        limit -= 1
        if len(inner) * 2 > len(s):
            return _deeper_than(inner, limit)
        s = inner
    return False


def _deeper_than(brackets: bytes, limit: int) -> bool:
    depth = 0
    for start in range(0, len(brackets), _SCAN):
        running = list(accumulate(map(_STEP.__getitem__, brackets[start:start + _SCAN]), initial=depth))
        if max(running) > limit:
            return True
        depth = running[-1]
    return False
