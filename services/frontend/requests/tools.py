"""A chat request's `tools` and `tool_choice` checked, as vLLM checks them, with 400s naming the field.

Runs in each API server process, from `preparer.py`. Tools are kept as given: the chat template
renders them as they came. `tool_choice` comes out normalized to "none", "auto", "required" or the
named-function dict; only what this server can honour gets past `resolve_tool_choice`.
"""
from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import msgspec

from services.frontend.errors import APIError

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
CHOICES = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
_encoder = msgspec.json.Encoder()
# A JSON Schema in a request (a tool's parameters, a structured-output schema), as JSON: a bound on the
# work it makes here and in the engine's grammar compiler. Real tool schemas are a few KiB; this
# allows ~5,000 described properties, OpenAI's own limit for a structured-output schema.
MAX_SCHEMA_BYTES = 256 * 1024


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"{uri} is not fetched: a schema in a request must be whole (refer within it with #/...)")


# The draft 2020-12 meta-schema (built into jsonschema-rs: nothing is fetched), formats checked (so a
# `pattern` must be a regex). jsonschema-rs, in Rust, checks a schema in ~10 us per property where
# the `jsonschema` package took ~350 us, and a 1 MiB schema ~12 ms where that took 8 s of CPU.
_META = jsonschema_rs.Draft202012Validator({"$ref": "https://json-schema.org/draft/2020-12/schema"},
                                          retriever=_no_fetch, validate_formats=True)


def _refuse(field: str, problem: str) -> APIError:
    return APIError(400, f"{field}: {problem}", param=field)


def check_tools(tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """The request's tools, unchanged, once each has the shape OpenAI defines; () when none were sent."""
    if tools is None:
        return ()
    if not tools:  # as vLLM and OpenAI
        raise APIError(400, "tools: must not be an empty array; either provide at least one tool or omit "
                       "the field", param="tools")
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = _check_tool(f"tools[{i}]", tool)
        if name in seen:
            raise _refuse(f"tools[{i}].function.name", f"{name!r} is also the name of tools[{seen[name]}]; "
                          "tool names must be unique")
        seen[name] = i
    return tuple(tools)


def _check_tool(where: str, tool: dict[str, Any]) -> str:
    kind = tool.get("type", "function")  # vLLM defaults a missing type to "function"
    if kind != "function":
        raise _refuse(f"{where}.type", f'{kind!r} is not supported: the only tool type is "function"')
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _refuse(f"{where}.function", 'required: an object {"name", "description"?, "parameters"?, '
                      '"strict"?}')
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _refuse(f"{where}.function.name", f"{name!r} is not a valid name: it must be 1 to 64 characters "
                      "of a-z, A-Z, 0-9, underscores and dashes")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _refuse(f"{where}.function.description", "must be a string or null")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _refuse(f"{where}.function.strict", "must be a boolean or null")
    parameters = function.get("parameters")
    if parameters is not None:
        _check_parameters(f"{where}.function.parameters", parameters)
    return name


def _check_parameters(field: str, schema: Any) -> None:
    if not isinstance(schema, dict):
        raise _refuse(field, f"must be a JSON Schema object, got {type(schema).__name__}")
    problem = schema_problem(_encoder.encode(schema), schema)
    if problem is not None:
        at, message = problem
        raise _refuse(field + at, message)


def schema_problem(encoded: bytes, schema: Any) -> tuple[str, str] | None:
    """Where (a path below the field) and why a schema (`schema`, and `encoded`, its JSON) is refused:
    larger than MAX_SCHEMA_BYTES, or not valid against the draft 2020-12 meta-schema. None if neither."""
    if len(encoded) > MAX_SCHEMA_BYTES:
        return "", (f"the JSON Schema is {len(encoded):,} bytes as JSON; at most {MAX_SCHEMA_BYTES:,} are accepted "
                    "(a bound on the work of checking and compiling it)")
    try:
        _META.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.instance_path)
        return at, f"is not a valid JSON Schema (draft 2020-12): {exc.message}"
    return None


def resolve_tool_choice(choice: Any, tools: tuple[dict[str, Any], ...], *, enable_auto_tool_choice: bool,
                        tool_call_parser: str | None) -> str | dict[str, Any]:
    """`tool_choice` normalized, as vLLM resolves it: absent means "auto" beside tools and "none"
    without; null means "none". "auto" needs the server's tool-call parser; "required" and a named
    function need guaranteed structured output, which this server does not have yet."""
    if choice is msgspec.UNSET:
        choice = "auto" if tools else "none"
    if choice is None or choice == "none":  # tools are still rendered into the prompt
        return "none"
    if not tools:
        raise APIError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if choice == "auto":
        if not (enable_auto_tool_choice and tool_call_parser):
            raise APIError(400, AUTO_NEEDS_FLAGS, param="tool_choice")
        return "auto"
    if choice == "required":
        return "required"
    if not isinstance(choice, dict):
        raise APIError(400, f"tool_choice: {choice!r} is not one of {CHOICES}", param="tool_choice")
    return {"type": "function", "function": {"name": _named_function(choice, tools)}}


def forced_schema(choice: str | dict[str, Any], tools: tuple[dict[str, Any], ...], *, parallel: bool) -> str:
    """The JSON Schema (as JSON text) the output of a forced tool_choice must match, as vLLM builds it:
    a named function's parameters, or for "required" an array of {"name", "parameters"} objects, one
    shape per tool (at most one item without parallel_tool_calls)."""
    params = {tool["function"]["name"]: tool["function"].get("parameters") or {"type": "object"} for tool in tools}
    if isinstance(choice, dict):
        return _encoder.encode(params[choice["function"]["name"]]).decode()
    item = {"anyOf": [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                          "parameters": schema},
                       "required": ["name", "parameters"], "additionalProperties": False}
                      for name, schema in params.items()]}
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": item}
    if not parallel:
        array["maxItems"] = 1
    return _encoder.encode(array).decode()


def _named_function(choice: dict[str, Any], tools: tuple[dict[str, Any], ...]) -> str:
    kind = choice.get("type", "function")
    if kind != "function":
        raise _refuse("tool_choice.type", f"{kind!r} is not one of {CHOICES}")
    function = choice.get("function")
    if not isinstance(function, dict):
        raise _refuse("tool_choice.function", 'required: an object {"name": ...} naming one of the tools')
    name = function.get("name")
    names = [tool["function"]["name"] for tool in tools]
    if not isinstance(name, str) or not name:
        raise _refuse("tool_choice.function.name", f"required: the name of one of the tools ({', '.join(names)})")
    if name not in names:
        raise _refuse("tool_choice.function.name", f"{name!r} does not match any of the tools: {', '.join(names)}")
    return name
