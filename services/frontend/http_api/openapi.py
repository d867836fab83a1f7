"""The frontend's OpenAPI document, served at /openapi.json by each API server process. The request
bodies are generated from the structs that parse them (openai_schema.py, tokenization.py, token_in.py) with
msgspec, with the number ranges the checks apply and the values `messages.py` accepts added, so the
document cannot drift from what is parsed."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from prompting.chat_messages import ROLES
from services.frontend.requests.openai_schema import (
    BOUNDS,
    CHAT_BOUNDS,
    PROMPT_BOUNDS,
    Bounds,
    ChatCompletionRequest,
    CompletionRequest,
)
from services.frontend.requests.token_in import TokenInRequest
from services.frontend.requests.tokenization import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest
from services.frontend.requests.translator import PIN_HEADER
from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS

_REF = "#/components/schemas/{name}"
# The error body errors.py builds (no struct: it is built once per error, from a dict).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer"]}}}}}


_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "string", "minLength": 1}, _TOKEN_IDS,
    {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]}, "minItems": 1,
     "maxItems": 1}]}


_BODIES = [ChatCompletionRequest, CompletionRequest, TokenInRequest, TokenizeCompletionRequest, TokenizeChatRequest,
           DetokenizeRequest]


def document(model: str, *, render_only: bool = False, max_logprobs: int = 20,
             adapters: Sequence[str] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a frontend serving `model` with `--max-logprobs`; `adapters`: the LoRA
    adapters every route also takes as its model;
    `render_only`: without the generation routes, which a render-only frontend does not serve."""
    refs, schemas = msgspec.json.schema_components(_BODIES, ref_template=_REF)
    chat, completion, token_in, tokenize_text, tokenize_chat, detokenize = refs
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}  # and MAX_STOP_CHARS in all
    stops = {"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP_STRINGS}, {"type": "null"}],
             "default": None}
    counts = Bounds(0, max_logprobs, "")  # check_logprobs' range
    for name, bounds in (("ChatCompletionRequest", {**BOUNDS, **PROMPT_BOUNDS, **CHAT_BOUNDS, "top_logprobs": counts,
                                                    "prompt_logprobs": counts}),
                         ("CompletionRequest", {**BOUNDS, **PROMPT_BOUNDS, "logprobs": counts,
                                                "prompt_logprobs": counts})):
        properties = schemas[name]["properties"]
        properties["model"]["enum"] = [model, *adapters]
        for field, bound in bounds.items():
            _number(properties[field]).update(bound.json_schema())
        properties["stop"] = stops
    for name in ("TokenInRequest", "TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest"):
        schemas[name]["properties"]["model"]["anyOf"][0]["enum"] = [model, *adapters]  # may be left out, or null
    _token_in(schemas, stops)
    schemas["ChatMessage"]["properties"]["role"]["enum"] = list(ROLES)
    # messages.py refuses other parts, and a text part without its text.
    schemas["ContentPart"]["properties"].update(type={"enum": ["text"]}, text={"type": "string"})
    schemas["ContentPart"]["required"] = ["type", "text"]
    for name in ("ChatCompletionRequest", "TokenizeChatRequest"):
        schemas[name]["properties"]["messages"]["minItems"] = 1  # ChatTemplate.render's check
    schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["minimum"] = 0
    # The struct's list[Any] (msgspec takes one array type in a union): the forms Translator.completion takes.
    schemas["CompletionRequest"]["properties"]["prompt"] = PROMPT_SCHEMA
    schemas["Error"] = ERROR_SCHEMA
    pin = {"name": PIN_HEADER, "in": "header", "required": False, "schema": {"type": "integer"},
           "description": "the data-parallel rank to run the request on"}
    paths: dict[str, Any] = {}
    if not render_only:
        paths["/v1/chat/completions"] = {"post": _generate("Chat completion", chat, pin)}
        paths["/v1/completions"] = {"post": _generate("Text completion", completion, pin)}
        paths["/inference/v1/generate"] = {"post": _generate(
            "Token ids in, token ids out (vLLM's token-in route: no render, no tokenize)", token_in, pin)}
    paths.update({
        "/v1/chat/completions/render": {"post": _json_post(
            "A chat request as the token-in request that /inference/v1/generate takes", chat)},
        "/v1/completions/render": {"post": _json_post(
            "A text completion request as token-in requests (a list of one)", completion)},
        "/tokenize": {"post": _json_post("Token ids of a prompt, or of a chat rendered with the chat template",
                                         {"anyOf": [tokenize_text, tokenize_chat]})},
        "/detokenize": {"post": _json_post("The text of token ids", detokenize)},
        "/v1/models": {"get": _get("The model served", "application/json")},
        "/version": {"get": _get("The server's version", "application/json")},
        "/health": {"get": _get("Liveness", "application/json")},
        "/ready": {"get": _get("Readiness: every engine rank handshaken", "application/json", 503)},
        "/metrics": {"get": _get("Prometheus metrics", "text/plain")},
        "/openapi.json": {"get": _get("This document", "application/json")},
    })
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleet frontend", "version": "1", "description": f"OpenAI-compatible API serving {model}"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _token_in(schemas: dict[str, Any], stops: dict[str, Any]) -> None:
    """token_in.check's ranges, in the token-in request's schemas."""
    sampling = schemas["TokenSampling"]["properties"]
    for field, bound in BOUNDS.items():
        if field in sampling and field != "n":
            _number(sampling[field]).update(bound.json_schema())
    sampling["n"].update(minimum=1, maximum=1)
    sampling["output_kind"].update(minimum=0, maximum=2)
    _number(sampling["stream_interval"]).update(minimum=1)
    sampling["stop"] = stops
    request = schemas["TokenInRequest"]["properties"]
    request["token_ids"].update(minItems=1)
    request["token_ids"]["items"]["minimum"] = 0
    request["priority"].update(BOUNDS["priority"].json_schema())


def _number(schema: dict[str, Any]) -> dict[str, Any]:
    """The number branch of a field's schema (`int | None` is anyOf [integer, null])."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") in ("integer", "number"):
            return branch
    raise ValueError(f"no number in {schema}")


def _errors() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    return {"400": {"description": "A field is invalid: `param` names it", **error},
            "404": {"description": "Unknown model", **error},
            "413": {"description": "The body is over the size limit", **error},
            "503": {"description": "No engine ready", **error}}


def _generate(summary: str, body: dict[str, Any], pin: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "parameters": [pin],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "The completion (JSON), or its chunks (SSE) when `stream`",
                                  "content": {"application/json": {}, "text/event-stream": {}}}, **_errors()}}


def _json_post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": summary, "content": {"application/json": {}}}, **_errors()}}


def _get(summary: str, media_type: str, other: int | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": summary, "content": {media_type: {}}}}
    if other is not None:
        responses[str(other)] = {"description": "Not yet", "content": {media_type: {}}}
    return {"summary": summary, "responses": responses}
