"""The one entry of every JSON request body the frontend reads (each HTTP route's, the LoRA routes'):
`check_entry` before anything decodes it, then `decode` into the route's struct, with 400s that name
the field. Runs in each API server process, and in its translation workers for long bodies.

Where vLLM (pydantic) is lenient and it is safe, so is this (docs/request-fields.md): a whole-number
float in an integer field (`"max_tokens": 5.0`) is that integer, and a lone surrogate escape in a
string (`"\\ud800"`) is U+FFFD. Both are tried only once the strict decode has failed, so a body that
needs neither pays nothing. NaN and Infinity, which JSON does not have, are refused naming the field.
"""
from __future__ import annotations

import re
from typing import Any

import msgspec

from edge.json_depth import MAX_DEPTH, too_deep
from edge.json_text import lone_surrogates_replaced, non_finite
from services.frontend.errors import APIError, from_validation

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
# msgspec's complaint about a float where the struct has an integer (maybe or null, or unset).
_INT_GOT_FLOAT = re.compile(r"Expected `int(?: \| [a-z]+)*`, got `float` - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(?P<key>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]")
_MAX_FIXES = 32  # integer fields holding whole-number floats, mended one field (or one array) at a time


def check_entry(body: bytes) -> None:
    """What every body must pass before any decoder sees it: not empty, and not nested so deep that
    the decoder (or the checks and the encoder after it) would recurse past Python's limit."""
    if not body.strip():
        raise APIError(400, "request body is empty: expected a JSON object")
    if too_deep(body):
        raise APIError(400, f"request body nests too deeply: arrays and objects may nest {MAX_DEPTH} levels at most")


def decode_text(param: str, text: str) -> Any:
    """JSON sent as a string inside a body (a schema or a structural tag as text), decoded with the
    same entry checks, refused as the field `param`."""
    raw = text.encode()
    if too_deep(raw):
        raise APIError(400, f"{param}: nests too deeply: arrays and objects may nest {MAX_DEPTH} levels at most",
                       param=param)
    try:
        return msgspec.json.decode(lone_surrogates_replaced(raw))
    except msgspec.DecodeError as exc:
        raise APIError(400, f"{param}: is not valid JSON: {exc}", param=param) from None


def parse(cls: type[Any], body: bytes) -> Any:
    """A body checked at the entry and decoded into `cls`."""
    check_entry(body)
    return decode(cls, body)


def decode(cls: type[Any], body: bytes) -> Any:
    """A body that passed `check_entry`, decoded into `cls`; a 400 naming the field otherwise."""
    decoder = _decoders.get(cls)
    if decoder is None:  # built once per struct, at first use
        decoder = _decoders[cls] = msgspec.json.Decoder(cls)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        if _INT_GOT_FLOAT.search(str(exc)):
            return _whole_numbers(decoder, body, exc)
        if str(exc).startswith("Number out of range"):  # 1e400: msgspec cannot say where
            _refuse_non_finite(body)
        raise _refusal(exc) from None
    except msgspec.DecodeError as exc:
        mended = lone_surrogates_replaced(body)
        if mended is not body:
            return decode(cls, mended)
        _refuse_non_finite(body)
        raise APIError(400, f"request body is not valid JSON: {exc}") from None


def _refuse_non_finite(body: bytes) -> None:
    """A 400 naming the field that holds NaN, Infinity or a number past a float's range, if one does."""
    found = non_finite(body)
    if found is not None:
        where, literal = found
        raise APIError(400, f"{where or 'request body'}: {literal} is not a finite number; send a finite number",
                       param=where or None) from None


def _refusal(exc: msgspec.ValidationError) -> APIError:
    if str(exc).startswith("Expected `object`") and " - at `$" not in str(exc):  # the body itself
        return APIError(400, "request body must be a JSON object")
    return from_validation(exc)


def _whole_numbers(decoder: msgspec.json.Decoder[Any], body: bytes, exc: msgspec.ValidationError) -> Any:
    """The body decoded again with each whole-number float that an integer field holds made an int
    (every one in the same array at once: token ids come in arrays); a fraction stays the 400. The
    strict decode stopped at the first float, so what comes after it has not been read yet: a lone
    surrogate is mended here too, and NaN, Infinity or 1e400 refused naming its field."""
    try:
        doc = msgspec.json.decode(lone_surrogates_replaced(body))
    except msgspec.DecodeError as bad:  # a ValidationError too: 1e400
        _refuse_non_finite(body)
        raise APIError(400, f"request body is not valid JSON: {bad}") from None
    for _ in range(_MAX_FIXES):
        m = _INT_GOT_FLOAT.search(str(exc))
        place = _locate(doc, m.group("path")) if m else None
        if place is None:
            break
        parent, key = place
        value = parent[key]
        if not (isinstance(value, float) and value.is_integer()):
            break
        if isinstance(parent, list):
            parent[:] = [int(v) if isinstance(v, float) and v.is_integer() else v for v in parent]
        else:
            parent[key] = int(value)
        try:
            return decoder.decode(msgspec.json.encode(doc))
        except msgspec.ValidationError as again:
            exc = again
    raise _refusal(exc) from None


def _locate(doc: Any, path: str) -> tuple[Any, Any] | None:
    """The container and key (or index) that msgspec's path (`.messages[0].content`) names, or None."""
    steps = list(_STEP.finditer(path))
    if not steps or sum(len(s.group()) for s in steps) != len(path):
        return None
    parent: Any = None
    key: Any = None
    node = doc
    for step in steps:
        parent, key = node, step.group("key") if step.group("key") is not None else int(step.group("index"))
        if isinstance(key, str) and isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(key, int) and isinstance(node, list) and key < len(node):
            node = node[key]
        else:
            return None
    return parent, key
