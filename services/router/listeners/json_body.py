"""A request body's JSON decoded as the router's routes take it (router process, or a body worker for a
long one): nesting checked on the bytes first, msgspec's strict decoder for the common case, and for
what it refuses, the lenient reading vLLM's clients rely on: lone surrogates (JavaScript clients cut
text inside an emoji) become U+FFFD as a lenient UTF-8 decoder makes them, and NaN or Infinity where a
number goes is a 400 that names the field. Pure: the errors are BodyError, never HTTP."""
from __future__ import annotations

from typing import Any

import msgspec

from edge.json_depth import MAX_DEPTH, too_deep
from edge.json_text import lone_surrogates_replaced, non_finite

_decode = msgspec.json.Decoder()


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
    except msgspec.ValidationError as exc:  # a number past a float's range
        body = _lenient(raw, msgspec.DecodeError(str(exc)))
    except msgspec.DecodeError as exc:
        body = _lenient(raw, exc)
    if not isinstance(body, dict):
        raise BodyError("the request body must be a JSON object")
    return body


def _lenient(raw: bytes, strict_error: msgspec.DecodeError) -> Any:
    """What msgspec refused, read by the shared entry rules (edge/json_text.py, as the frontend reads
    it): lone surrogates made U+FFFD; NaN, Infinity or a number past a float's range a 400 naming the
    field; anything else msgspec's 400."""
    mended = lone_surrogates_replaced(raw)
    if mended is not raw:
        try:
            return _decode.decode(mended)
        except msgspec.DecodeError as exc:
            raw, strict_error = mended, exc
    found = non_finite(raw)
    if found is not None:
        where, literal = found
        raise BodyError(f"{where or 'the request body'}: must be a finite number, got {literal}", where)
    raise BodyError(f"the request body is not valid JSON: {strict_error}")
