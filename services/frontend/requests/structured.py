"""A request's structured-output constraint, from whichever field asked for it: OpenAI's
`response_format`, vLLM's `structured_outputs`, or vLLM's older `guided_*` fields. Runs in each API
server process (and its workers), from translation.

At most one constraint per request, as vLLM has it. Checked here where it is cheap: a JSON schema
must be a JSON Schema (the draft 2020-12 meta-schema, as tools' parameters are), a structural tag a
JSON object, choices a non-empty list. Regexes and grammars are compiled by the engine (xgrammar),
whose refusal comes back as a 400 naming the field: Python's `re` reads another dialect (it refuses
`[^]`, `\\u{41}` and `(?<name>...)`, which xgrammar takes), so it cannot judge them here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from services.frontend.errors import APIError
from services.frontend.requests.json_body import decode_text
from services.frontend.requests.openai_schema import (
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    StructuralTagFormat,
    StructuredOutputsParams,
    TextFormat,
)
from services.frontend.requests.tools import MAX_SCHEMA_BYTES, schema_problem

# The structured-output backend of this project's vllm engines (services/engine/backends/vllm.py).
ENGINE_BACKEND = "xgrammar"
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint: the request field that set it (as a 400 names it) and its SamplingParams form."""

    param: str
    kind: str  # a SamplingParams field: json_schema, regex, choice, grammar, json_object, structural_tag
    value: str | list[str] | bool


def constraint(req: Any) -> Constraint | None:
    """The request's constraint, or None; a 400 naming the field for a bad one or for a second one."""
    found: list[Constraint] = []
    fmt = req.response_format
    if isinstance(fmt, JsonObjectFormat):
        found.append(Constraint("response_format", "json_object", True))
    elif isinstance(fmt, JsonSchemaResponseFormat):
        schema = fmt.json_schema.schema
        if schema is None:
            raise _refuse("response_format.json_schema.schema", "required: the JSON Schema the output must match")
        found.append(Constraint("response_format.json_schema.schema", "json_schema",
                                _json_schema("response_format.json_schema.schema", schema)))
    elif isinstance(fmt, StructuralTagFormat):
        if (fmt.format is None) == (fmt.structures is None and fmt.triggers is None):
            raise _refuse("response_format", "a structural_tag has either `format`, or `structures` and `triggers`")
        if fmt.format is None and (fmt.structures is None or fmt.triggers is None):
            raise _refuse("response_format", "a legacy structural_tag needs both `structures` and `triggers`")
        tag = _encoder.encode(fmt).decode()
        _bounded("response_format", tag)
        found.append(Constraint("response_format", "structural_tag", tag))
    else:
        assert fmt is None or isinstance(fmt, TextFormat)
    if req.structured_outputs is not None:
        found.append(from_structured_outputs(req.structured_outputs))
    if req.guided_json is not None:
        found.append(Constraint("guided_json", "json_schema", _json_schema("guided_json", req.guided_json)))
    if req.guided_regex is not None:
        found.append(_regex("guided_regex", req.guided_regex))
    if req.guided_choice is not None:
        found.append(_choice("guided_choice", req.guided_choice))
    if req.guided_grammar is not None:
        found.append(_grammar("guided_grammar", req.guided_grammar))
    if req.structural_tag is not None:
        found.append(_structural_tag("structural_tag", req.structural_tag))
    if req.guided_decoding_backend not in (None, ENGINE_BACKEND):
        raise _refuse("guided_decoding_backend", f"{req.guided_decoding_backend!r}: the engines' structured output "
                      f"is {ENGINE_BACKEND!r}, chosen when they start; a request cannot choose another (nor can it "
                      "in vLLM V1)")
    if len(found) > 1:
        raise _refuse(found[1].param, f"only one kind of structured output per request, and {found[0].param} "
                      "asks for one already")
    return found[0] if found else None


def from_structured_outputs(so: StructuredOutputsParams | Any, at: str = "structured_outputs") -> Constraint:
    """vLLM's StructuredOutputsParams (`so`, at the request field `at`) as its one constraint; the
    token-in route's sampling_params.structured_outputs too."""
    kinds = [k for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
             if getattr(so, k) is not None]
    if len(kinds) != 1:
        got = f"{len(kinds)} ({', '.join(kinds)})" if kinds else "none"
        raise _refuse(at, f"set exactly one of json, regex, choice, grammar, json_object and structural_tag; got {got}")
    if so.whitespace_pattern is not None:
        raise _refuse(f"{at}.whitespace_pattern", f"{ENGINE_BACKEND}, the engines' structured-output backend, "
                      "takes no whitespace pattern (JSON is always compact here)")
    # disable_any_whitespace: the engines always write compact JSON; disable_additional_properties:
    # xgrammar's strict mode already refuses properties a schema does not name. Both hold either way.
    kind, where = kinds[0], f"{at}.{kinds[0]}"
    if kind == "json":
        assert so.json is not None
        return Constraint(where, "json_schema", _json_schema(where, so.json))
    if kind == "regex":
        assert so.regex is not None
        return _regex(where, so.regex)
    if kind == "choice":
        assert so.choice is not None
        return _choice(where, so.choice)
    if kind == "grammar":
        assert so.grammar is not None
        return _grammar(where, so.grammar)
    if kind == "json_object":
        if so.json_object is not True:  # vLLM's rule: false is no constraint, and then none is set
            raise _refuse(where, "must be true if set; omit structured_outputs for unconstrained output")
        return Constraint(where, "json_object", True)
    assert so.structural_tag is not None
    return _structural_tag(where, so.structural_tag)


def _json_schema(param: str, schema: str | dict[str, Any]) -> str:
    """The schema as compact JSON text, once it is a valid JSON Schema object."""
    if isinstance(schema, str):
        schema = decode_text(param, schema)
    if not isinstance(schema, dict):
        raise _refuse(param, f"must be a JSON Schema object, got {type(schema).__name__}")
    encoded = _encoder.encode(schema)
    problem = schema_problem(encoded, schema)
    if problem is not None:
        at, message = problem
        raise _refuse(param + at, message)
    return encoded.decode()


def _bounded(param: str, text: str) -> None:
    """A constraint's text is compiled by the engine: bounded as a JSON Schema is (tools.py)."""
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise _refuse(param, f"is {size:,} bytes; at most {MAX_SCHEMA_BYTES:,} are accepted (a bound on the work "
                      "of compiling it)")


def _regex(param: str, regex: str) -> Constraint:
    _bounded(param, regex)
    if "\x00" in regex:  # vLLM's rule: xgrammar's converter cannot take it
        raise _refuse(param, "must not contain a NUL character")
    return Constraint(param, "regex", regex)


def _choice(param: str, choice: list[str]) -> Constraint:
    if not choice:
        raise _refuse(param, "must list at least one string")
    return Constraint(param, "choice", list(choice))


def _grammar(param: str, grammar: str) -> Constraint:
    _bounded(param, grammar)
    if not grammar.strip():
        raise _refuse(param, "must not be empty: an EBNF (GBNF) or Lark grammar")
    return Constraint(param, "grammar", grammar)


def _structural_tag(param: str, tag: str) -> Constraint:
    _bounded(param, tag)
    value = decode_text(param, tag)
    if not isinstance(value, dict):
        raise _refuse(param, "must be a JSON object (a structural tag)")
    return Constraint(param, "structural_tag", tag)


def _refuse(param: str, problem: str) -> APIError:
    return APIError(400, f"{param}: {problem}", param=param)
