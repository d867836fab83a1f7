"""A request body's JSON decoded as the router's routes take it (router process, or a body worker for a
long one): nesting checked on the bytes first, msgspec's strict decoder for the common case, and for
what it refuses, the lenient reading vLLM's clients rely on: lone surrogates (JavaScript clients cut
text inside an emoji) become U+FFFD as a lenient UTF-8 decoder makes them, and NaN or Infinity where a
number goes is a 400 that names the field. Pure: the errors are BodyError, never HTTP."""
from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from edge.json_depth import MAX_DEPTH, too_deep

_decode = msgspec.json.Decoder()
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs: any left is alone


class BodyError(ValueError):
    """A body the router cannot read; `param` names the field at fault, "" for the body itself."""

    def __init__(self, message: str, param: str = "") -> None:
        super().__init__(message)
        self.message, self.param = message, param

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a body worker, re-raised in the router
        return BodyError, (self.message, self.param)


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; BodyError says why not."""
    if too_deep(raw):  # before decoding: the decoder, the codecs and the encoder recurse per level
        raise BodyError(f"the request body nests too deeply: arrays and objects may nest {MAX_DEPTH} levels at most")
    try:
        body = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        body = _lenient(raw, exc)
    if not isinstance(body, dict):
        raise BodyError("the request body must be a JSON object")
    return body


def _lenient(raw: bytes, strict_error: msgspec.DecodeError) -> Any:
    """What msgspec refused, read as Python's json module reads it (NaN, Infinity, numbers out of a
    float's range, lone surrogates), then made safe; still invalid JSON is msgspec's 400."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BodyError(f"the request body is not valid JSON: {strict_error}") from None
    return _cleaned(body, "")


def _cleaned(value: Any, where: str) -> Any:
    """`value` with lone surrogates replaced; a non-finite number raises BodyError naming its path."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        raise BodyError(f"{where or 'the request body'}: must be a finite number, got {value}", where)
    if isinstance(value, list):
        return [_cleaned(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {_LONE_SURROGATE.sub("\ufffd", key): _cleaned(item, f"{where}.{key}" if where else key)
                for key, item in value.items()}
    return value
