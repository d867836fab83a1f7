"""Typing a tool-call parameter written as text by the parameter's JSON schema in the request's
tools (the XML-style formats: qwen3_coder, glm45). Runs in frontend API-server processes."""
from __future__ import annotations

import math
from typing import Any

from services.frontend.parsers.json_scan import strict_json

__all__ = ["STRING_TYPES", "json_or_text", "parameter_schemas", "schema_type", "typed_value"]

STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})


def parameter_schemas(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """function name -> its parameters' property schemas, from the request's tools."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        schemas[function["name"]] = properties if isinstance(properties, dict) else {}
    return schemas


def schema_type(schema: Any) -> tuple[str, bool]:
    """(the first non-null type, whether null is allowed); "string" when none is given."""
    if not isinstance(schema, dict):
        return "string", False
    options = schema.get("type")
    if options is None and isinstance(schema.get("anyOf"), list):
        options = [o.get("type") for o in schema["anyOf"] if isinstance(o, dict)]
    if not isinstance(options, list):
        options = [options]
    names = [str(o).strip().lower() for o in options if o is not None]
    kinds = [n for n in names if n != "null"]
    return (kinds[0] if kinds else "string"), "null" in names


def typed_value(text: str, schema: Any) -> Any:
    """The value of `text` for a parameter of `schema` (see qwen3_coder's docstring for the rules)."""
    kind, nullable = schema_type(schema)
    is_null = text.lower() in ("null", "none")
    if kind in STRING_TYPES:
        return None if nullable and is_null else text
    if is_null:
        return None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(text)
        except ValueError:
            return text
    if kind.startswith(("num", "float")):
        try:
            number = float(text)
        except ValueError:
            return text
        if not math.isfinite(number):
            return text
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        low = text.strip().lower()
        return low == "true" if low in ("true", "false") else text
    return json_or_text(text)


def json_or_text(text: str) -> Any:
    """The JSON value `text` is (NaN, Infinity and 1e400 are none), else the text itself."""
    try:
        return strict_json(text)
    except ValueError:
        return text
