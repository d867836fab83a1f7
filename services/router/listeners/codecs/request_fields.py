"""The checks the adapted APIs' request translations share (router process; pure): every field known or
refused by name, integers that may come as whole-number floats (as vLLM's pydantic models take them),
the same-named sampling fields carried to upstream's chat body, and upstream's refusals renamed to the
fields the client sent."""
from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from services.router.listeners.codecs.codec import CodecError

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


def check_fields(body: Mapping[str, Any], known: Collection[str], refused: Mapping[str, str], where: str = "") -> None:
    """A 400 for the first field that is neither `known` nor null; `refused` maps the fields this server
    knows of and cannot honour (vLLM's own extras, say) to why."""
    for key, value in body.items():
        if key in known:
            continue
        name = f"{where}.{key}" if where else key
        if key in refused:
            if value is not None:
                raise CodecError(name, refused[key])
            continue
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(sorted(known))}"
        raise CodecError(name, "unknown field" + hint)


def whole(value: Any, name: str, low: int | None = None) -> int:
    """An integer field's value: an int, or a float with no fraction (5.0 is 5, as vLLM takes it)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise CodecError(name, "must be an integer" + (f" >= {low}" if low is not None else ""))
    return value


def number(value: Any, name: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CodecError(name, "must be a number")
    return value


# Sampling fields vLLM's Responses and chat APIs both take under one name, carried as they are to
# upstream's chat body (its range checks name the same field): name -> the check of its type here.
def _strings(value: Any, name: str) -> Any:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return value
    raise CodecError(name, "must be a string or a list of strings")


def _ints(value: Any, name: str) -> Any:
    if not isinstance(value, list):
        raise CodecError(name, "must be a list of integers")
    return [whole(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _bias(value: Any, name: str) -> Any:
    if not isinstance(value, dict):
        raise CodecError(name, "must be an object of token ids to numbers")
    for token, bias in value.items():
        number(bias, f"{name}.{token}")
    return value


def _object(value: Any, name: str) -> Any:
    if not isinstance(value, dict):
        raise CodecError(name, "must be an object")
    return value


def _bool(value: Any, name: str) -> Any:
    if not isinstance(value, bool):
        raise CodecError(name, "must be a boolean")
    return value


def _string(value: Any, name: str) -> Any:
    if not isinstance(value, str):
        raise CodecError(name, "must be a string")
    return value


SAMPLING = {
    "stop": _strings, "top_k": whole, "min_p": number, "seed": whole, "logit_bias": _bias,
    "structured_outputs": _object, "presence_penalty": number, "frequency_penalty": number,
    "repetition_penalty": number, "stop_token_ids": _ints, "ignore_eos": _bool, "skip_special_tokens": _bool,
    "include_stop_str_in_output": _bool, "cache_salt": _string, "priority": whole,
    "chat_template_kwargs": _object,
}


def carry(body: Mapping[str, Any], chat: dict[str, Any], names: Collection[str]) -> None:
    """Each of `names` (keys of SAMPLING) the client set, type-checked, into upstream's chat body."""
    for name in names:
        value = body.get(name)
        if value is not None:
            chat[name] = SAMPLING[name](value, name)


def renamed_refusal(raw: bytes, renames: Mapping[str, str]) -> bytes | None:
    """Upstream's OpenAI-shaped error with the chat fields it names renamed to the client's; None when
    it names none of them (or is no such error), for the caller to pass it on as it is."""
    try:
        body = _decode.decode(raw)
        error = body["error"]
        param, message = error.get("param"), error.get("message")
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
        return None
    renamed = renamed_message(message, renames) if isinstance(message, str) else message
    if param not in renames and renamed == message:
        return None
    if param in renames:
        error["param"] = renames[param]
    error["message"] = renamed
    return _json.encode(body)


def renamed_message(message: str, renames: Mapping[str, str]) -> str:
    """`message` with chat field names replaced by the client's: names with an underscore wherever they
    stand as a word; plain words (stop, messages) only where they lead the message or are quoted. A name
    that starts a longer path (`messages[1].content`, `response_format.json_schema`) is left alone, as
    `param` is: the client's path below it differs (its input items are not the chat messages one for
    one), and a wrong path would be worse than the chat one."""
    for old, new in renames.items():
        if "_" in old:
            message = re.sub(rf"\b{re.escape(old)}\b(?![\[.])", new, message)
        else:
            message = re.sub(rf"^{re.escape(old)}\b(?![\[.])", new, message)
            message = re.sub(rf"([`'\"]){re.escape(old)}\1", rf"\g<1>{new}\g<1>", message)
    return message
