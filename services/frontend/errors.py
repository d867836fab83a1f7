"""OpenAI-style API errors: {"error": {"message", "type", "param", "code"}} with the right status."""
from __future__ import annotations

import re
from typing import Any

import msgspec

from prompting.errors import PromptError

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
          408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "internal_server_error", 503: "service_unavailable_error"}
_encoder = msgspec.json.Encoder()


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param, self.code)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole (raised in a worker process, re-raised in the API server)."""
        return _rebuild, (self.status, self.message, self.param, self.code)


def _rebuild(status: int, message: str, param: str | None, code: str | None) -> APIError:
    return APIError(status, message, param=param, code=code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    return _encoder.encode({"error": {"message": message, "type": _TYPES.get(status, "error"),
                                      "param": param, "code": code if code is not None else status}})


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def from_validation(exc: msgspec.ValidationError) -> APIError:
    """msgspec says e.g. "Expected `int`, got `str` - at `$.max_tokens`": name the field first."""
    text = str(exc)
    m = _PATH.search(text)
    param = None
    if m:
        param = m.group("path").lstrip(".") or None
        text = text[: m.start()]
    unknown = re.match(r"Object contains unknown field `(?P<field>[^`]+)`", text)
    if unknown:
        field = unknown.group("field")
        param = f"{param}.{field}" if param else field
        return APIError(400, f"{param}: unknown field: it is neither OpenAI's nor vLLM's, and this server refuses "
                        "what it does not know rather than ignore it (docs/request-fields.md lists the fields)",
                        param=param)
    missing = re.match(r"Object missing required field `(?P<field>[^`]+)`", text)
    if missing:
        field = missing.group("field")
        param = f"{param}.{field}" if param else field
        return APIError(400, f"{param}: this field is required", param=param)
    text = text[0].lower() + text[1:] if text else text
    return APIError(400, f"{param}: {text}" if param else text, param=param)


def refused_prompt(exc: PromptError) -> APIError:
    """The prompting library's refusal of a request field, as the 400 naming that field."""
    return APIError(400, str(exc), param=exc.param)
