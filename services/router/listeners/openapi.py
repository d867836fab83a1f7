"""The router's OpenAPI document, served at /openapi.json on each listener (router process).

The codecs read request bodies as dicts, field by field, so there are no structs to generate it
from; the structs here describe what they accept, and msgspec generates the document's schemas from
them. tests/unit/router/test_openapi.py holds the two together: every documented field of a wrong
type must be a 400 naming it, every documented value accepted. Chat and completions go upstream as
they came: only what the router reads of them is described.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import msgspec

from services.router.config import FAMILIES, ListenerConfig
from services.router.listeners import systemone_schema

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
_REF = "#/components/schemas/{name}"


class _Shape(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A request shape, documented only: unknown fields are passed on (chat, completions) or ignored
    (input items and content blocks, which SDKs send back with fields of their own)."""


class _Strict(_Shape, forbid_unknown_fields=True):
    """A shape whose unknown fields the codec refuses by name (request_fields.check_fields)."""


# ---- chat and completions (passed through upstream) ----

class ChatMessage(_Shape):
    role: Literal["system", "developer", "user", "assistant", "tool"]  # the router takes any string: upstream's say
    content: Union[str, list[dict[str, Any]], None] = None


class ChatRequest(_Shape):
    model: str
    messages: list[ChatMessage]
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None


class CompletionsRequest(_Shape):
    model: str
    prompt: Union[str, list[Any]]
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None


# ---- the Responses API (responses_request.py) ----

class InputText(_Shape):
    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(_Shape, tag_field="type", tag="message"):
    """`type` may be left out: an input item without one is a message."""
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[InputText]]


class FunctionCall(_Shape, tag_field="type", tag="function_call"):
    call_id: NonEmpty
    name: NonEmpty
    arguments: str


class FunctionCallOutput(_Shape, tag_field="type", tag="function_call_output"):
    call_id: NonEmpty
    output: Union[str, list[InputText]]


class ReasoningText(_Shape):
    type: Literal["reasoning_text"]
    text: str


class SummaryText(_Shape):
    type: Literal["summary_text"]
    text: str


class ReasoningItem(_Shape, tag_field="type", tag="reasoning"):
    content: list[ReasoningText] | None = None
    summary: list[SummaryText] | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    name: NonEmpty
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict):
    type: Literal["function"]
    name: NonEmpty


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(_Strict, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(_Strict, tag_field="type", tag="json_object"):
    pass


class JsonSchemaFormat(_Strict, tag_field="type", tag="json_schema"):
    name: NonEmpty
    schema: dict[str, Any]
    strict: bool | None = None
    description: str | None = None


class TextOptions(_Strict):
    format: Union[TextFormat, JsonObjectFormat, JsonSchemaFormat, None] = None


class ResponsesRequest(_Strict):
    model: str
    input: Union[str, list[Union[InputMessage, FunctionCall, FunctionCallOutput, ReasoningItem]]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: Reasoning | None = None
    stream: bool | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedFunction, None] = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    truncation: Literal["disabled"] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Output logprobs, answered in each output_text part.
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    include: list[Literal["message.output_text.logprobs", "reasoning.encrypted_content"]] | None = None
    # vLLM's Responses extras, carried to upstream's chat body as they are.
    stop: Union[str, list[str], None] = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    structured_outputs: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    cache_salt: str | None = None
    priority: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # The response state, where the router keeps it (a `store` in its config): a 400 for an id elsewhere.
    previous_response_id: str | None = None
    conversation: Union[str, dict[str, Any], None] = None  # its id, or {"id": ...}; not with previous_response_id
    store: bool | None = None  # false: this response is not kept (without state it never is)
    # Accepted, no change to the answer.
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None


# ---- the Anthropic Messages API (anthropic_request.py) ----

class TextBlock(_Shape, tag_field="type", tag="text"):
    text: str


class ToolUseBlock(_Shape, tag_field="type", tag="tool_use"):
    id: NonEmpty
    name: NonEmpty
    input: dict[str, Any]


class ToolResultBlock(_Shape, tag_field="type", tag="tool_result"):
    tool_use_id: NonEmpty
    content: Union[str, list[TextBlock]] = ""
    is_error: bool = False


class ThinkingBlock(_Shape, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Shape, tag_field="type", tag="redacted_thinking"):
    data: str | None = None


class Message(_Shape):
    role: Literal["user", "assistant"]
    content: Union[str, list[Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock]]]


class Tool(_Strict):
    name: NonEmpty
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None  # dropped: prefix caching upstream is automatic


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingEnabled(_Strict, tag_field="type", tag="enabled"):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1024)]  # and < max_tokens


class ThinkingDisabled(_Strict, tag_field="type", tag="disabled"):
    pass


UnitInterval = Annotated[float, msgspec.Meta(ge=0, le=1)]


class MessagesRequest(_Strict):
    model: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    system: Union[str, list[TextBlock], None] = None
    temperature: UnitInterval | None = None
    top_p: UnitInterval | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stop_sequences: list[NonEmpty] | None = None
    stream: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Union[ThinkingEnabled, ThinkingDisabled, None] = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's; thinking sets enable_thinking over it
    cache_salt: str | None = None  # vLLM's
    metadata: dict[str, Any] | None = None  # accepted, no change to the answer
    service_tier: str | None = None  # accepted, no change to the answer


class CountTokensRequest(_Shape):
    """Anthropic's count_tokens body: a Messages request without max_tokens (anthropic_count.py)."""
    model: str
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    system: Union[str, list[TextBlock], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Union[ThinkingEnabled, ThinkingDisabled, None] = None


# ---- the Images API (codecs/images.py; relayed as it came to an image pool) ----

class ImagesRequest(_Strict):
    """OpenAI's image generation request. `stream` may only be false: the router relays one JSON answer."""
    model: str
    prompt: NonEmpty
    n: Annotated[int, msgspec.Meta(ge=1, le=10)] | None = None
    size: Literal["auto", "256x256", "512x512", "1024x1024", "1536x1024", "1024x1536", "1792x1024",
                  "1024x1792"] | None = None
    response_format: Literal["url", "b64_json"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    quality: Literal["auto", "standard", "hd", "low", "medium", "high"] | None = None
    style: Literal["vivid", "natural"] | None = None
    background: Literal["transparent", "opaque", "auto"] | None = None
    moderation: Literal["low", "auto"] | None = None
    output_compression: Annotated[int, msgspec.Meta(ge=0, le=100)] | None = None
    user: str | None = None
    stream: bool | None = None


# ---- the document ----

# The API each listener `apis` name serves: path, request shape, what it does.
_APIS: dict[str, tuple[str, type[_Shape] | None, str]] = {
    "chat": ("/v1/chat/completions", ChatRequest, "OpenAI chat completion, routed and passed upstream"),
    "completions": ("/v1/completions", CompletionsRequest, "OpenAI text completion, routed and passed upstream"),
    "responses": ("/v1/responses", ResponsesRequest, "OpenAI Responses API, translated to chat upstream"),
    "messages": ("/v1/messages", MessagesRequest, "Anthropic Messages API, translated to chat upstream"),
    "count_tokens": ("/v1/messages/count_tokens", CountTokensRequest,
                     "Anthropic's token count of a Messages request, by a replica's POST /tokenize"),
    "explain": ("/v1/router/explain", None, "Where a chat, completions or Responses body would be routed, not sent"),
    "images": ("/v1/images/generations", ImagesRequest, "OpenAI image generation, routed to an image pool"),
}
_PART_OF = {"count_tokens": "messages"}  # served where that API is (codecs: Codec.part_of)
ERROR_SCHEMA: dict[str, Any] = {"type": "object", "required": ["error"], "properties": {"error": {"type": "object"}}}


def document(listener: ListenerConfig, models: tuple[str, ...],
             systemone: Mapping[str, str] | None = None, memory: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of one listener: its APIs, with `models` (its public names) as `model`;
    `systemone`: its published System One models' families by name (served when its apis have systemone);
    `memory`: some entry runs the memory plugin (its API is served when the apis have memory)."""
    shapes = (ChatRequest, CompletionsRequest, ResponsesRequest, MessagesRequest, CountTokensRequest, ImagesRequest)
    refs, schemas = msgspec.json.schema_components(shapes, ref_template=_REF)
    by_shape = dict(zip(shapes, refs, strict=True))
    models = _with_pools(models, listener)
    for request in shapes:
        schemas[request.__name__]["properties"]["model"]["enum"] = list(models)
    # msgspec requires a tagged struct's tag; the codec takes a message item without one.
    schemas["InputMessage"]["required"].remove("type")
    _untag(schemas["ResponsesRequest"]["properties"]["input"])
    schemas["Error"] = ERROR_SCHEMA
    paths: dict[str, Any] = {}
    for api, (path, shape, summary) in _APIS.items():
        if _PART_OF.get(api, api) in listener.apis:
            body = by_shape[shape] if shape is not None else {"anyOf": [by_shape[ChatRequest],
                                                                        by_shape[CompletionsRequest],
                                                                        by_shape[ResponsesRequest]]}
            paths[path] = {"post": _post(summary, body)}
    if "responses" in listener.apis:
        _stored_responses(paths)
    if "models" in listener.apis:
        paths["/v1/models"] = {"get": _get("The public model names served on this listener")}
    if "systemone" in listener.apis:
        _systemone(paths, schemas, systemone or {})
    if memory and "memory" in listener.apis:
        _memory(paths, schemas)
    paths["/health"] = {"get": _get("Liveness, and the ready replicas of each pool")}
    paths["/ready"] = {"get": _get("Readiness: 503 until every deployment in use has a ready worker")}
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "metrics", "content": {"text/plain": {}}}}}}
    paths["/openapi.json"] = {"get": _get("This document")}
    doc: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": f"fleet router: listener {listener.name}",
                                                        "version": "1"},
                           "paths": paths, "components": {"schemas": schemas}}
    if listener.api_keys:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"},
                                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
    return doc


def _with_pools(models: tuple[str, ...], listener: ListenerConfig) -> tuple[str, ...]:
    """The public names: the entries, then the chat pools the listener publishes by name (called directly)."""
    return models + tuple(name for name in listener.pools if name not in models)


def _systemone(paths: dict[str, Any], schemas: dict[str, Any], families: Mapping[str, str]) -> None:
    """The System One API's paths and schemas: per family of the published models, a request whose
    `model` is one of that family's names and the answer it gets (so `oneOf` picks one by the model)."""
    used = [f for f in FAMILIES if f in families.values()] or list(FAMILIES)
    shapes = [*(systemone_schema.REQUESTS[f] for f in used), *(systemone_schema.ANSWERS[f] for f in used),
              systemone_schema.SystemOneModelList]
    refs, components = msgspec.json.schema_components(shapes, ref_template=_REF)
    by_shape = dict(zip(shapes, refs, strict=True))
    for family in used:
        names = [name for name, f in families.items() if f == family]
        if names:
            components[systemone_schema.REQUESTS[family].__name__]["properties"]["model"]["enum"] = names
    schemas.update(components)
    body = {"oneOf": [by_shape[systemone_schema.REQUESTS[f]] for f in used]}
    answer = {"oneOf": [by_shape[systemone_schema.ANSWERS[f]] for f in used]}
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    responses = {
        "200": {"description": "The model's output, one row per input (a cross-encoder: per document), in order",
                "content": {"application/json": {"schema": answer}}},
        "400": {"description": "A field is invalid, or the model refused the input (too long); the message "
                               "names it", **error},
        "401": {"description": "Missing or wrong API key", **error},
        "404": {"description": "No such model published on this listener", **error},
        "429": {"description": "Every worker of the model is at its in-flight cap: retry after Retry-After", **error},
        "502": {"description": "The model's workers failed or answered wrongly", **error},
        "503": {"description": "The model has no ready worker", **error},
        "504": {"description": "No answer within the model's timeout (a recipe: its deadline)", **error}}
    summary = ("A published decision model's output: a classifier's classes, an embedding model's vectors, or a "
               "cross-encoder's scores; a native recipe escalates over its stages")
    for path, said in (("/v1/systemone", summary), ("/v1/decisions", "Alias of POST /v1/systemone")):
        paths[path] = {"post": {"summary": said, "responses": responses,
                                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}}
    paths["/v1/systemone/models"] = {"get": {
        "summary": "The System One models published on this listener: concrete models (routing false) and native "
                   "recipes (routing true)",
        "responses": {"200": {"description": "The list", "content": {"application/json": {
            "schema": by_shape[systemone_schema.SystemOneModelList]}}}}}}


class Memory(msgspec.Struct):
    """One memory: a turn of the caller's (their message and the answer), as the memory plugin kept it."""
    id: str
    object: Literal["memory"]
    created_at: int  # unix seconds
    content: str


class MemoryList(msgspec.Struct):
    object: Literal["list"]
    data: list[Memory]  # newest first
    has_more: bool


class MemoryDeleted(msgspec.Struct):
    id: str
    object: Literal["memory"]
    deleted: bool


class MemoriesDeleted(msgspec.Struct):
    object: Literal["list"]
    deleted: int  # how many went


def _memory(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """GET and DELETE /v1/memory (listeners/memory_api.py): the caller's own memories."""
    shapes = (MemoryList, Memory, MemoryDeleted, MemoriesDeleted)
    refs, components = msgspec.json.schema_components(shapes, ref_template=_REF)
    schemas.update(components)
    ref = dict(zip(shapes, refs, strict=True))
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    user = {"name": "user", "in": "query", "required": False, "schema": {"type": "string", "minLength": 1,
                                                                         "maxLength": 256},
            "description": "The end user whose memories these are (else the x-router-user header; neither: the "
                           "API key's own)"}
    page = [{"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
            {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0,
                                                                            "default": 0}}]
    memory_id = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}

    def answer(summary: str, shape: Any, *, missing: bool = False) -> dict[str, Any]:
        responses: dict[str, Any] = {
            "200": {"description": summary, "content": {"application/json": {"schema": ref[shape]}}},
            "400": {"description": "A query parameter is invalid; the message names it", **error},
            "503": {"description": "The store did not answer", **error}}
        if missing:
            responses["404"] = {"description": "No memory of the caller's has this id", **error}
        return {"summary": summary, "responses": responses}

    paths["/v1/memory"] = {
        "get": {**answer("The caller's memories, newest first", MemoryList), "parameters": [*page, user]},
        "delete": {**answer("Erase all of the caller's memories", MemoriesDeleted), "parameters": [user]}}
    paths["/v1/memory/{id}"] = {
        "get": {**answer("One of the caller's memories", Memory, missing=True), "parameters": [memory_id, user]},
        "delete": {**answer("Erase one of the caller's memories", MemoryDeleted, missing=True),
                   "parameters": [memory_id, user]}}


def _stored_responses(paths: dict[str, Any]) -> None:
    """The Responses API's state routes (listeners/responses_api.py): a stored response read, deleted,
    and its input items listed, by its owner (the API key, and the x-router-user header's user)."""
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    user = {"name": "x-router-user", "in": "header", "required": False, "schema": {"type": "string"},
            "description": "The user the response was created for (its `user`), if it named one"}
    missing = {"description": "No such response of this API key and user, or this router keeps no response state",
               **error}
    down = {"description": "The response store did not answer", **error}

    def route(summary: str, said: str, query: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"summary": summary, "parameters": [response_id, user, *(query or [])],
                "responses": {"200": {"description": said, "content": {"application/json": {}}},
                              "400": {"description": "A query parameter is invalid; the message names it", **error},
                              "404": missing, "503": down}}

    query = [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
             {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
             {"name": "after", "in": "query", "schema": {"type": "string"}}]
    paths["/v1/responses/{response_id}"] = {
        "get": route("A stored response, as its client got it", "The response object"),
        "delete": route("Delete a stored response", "{id, object: response, deleted: true}")}
    paths["/v1/responses/{response_id}/input_items"] = {
        "get": route("The input items of a stored response's own request (not the earlier turns')",
                     "A list: data, first_id, last_id, has_more", query)}
    _conversations(paths, user, query, error, down)


def _conversations(paths: dict[str, Any], user: dict[str, Any], query: list[dict[str, Any]],
                   error: dict[str, Any], down: dict[str, Any]) -> None:
    """OpenAI's Conversations API (listeners/conversations_api.py), for the owner as the responses are."""
    conversation_id = {"name": "conversation_id", "in": "path", "required": True, "schema": {"type": "string"}}
    item_id = {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}
    missing = {"description": "No such conversation (or item) of this API key and user, or this router keeps "
                              "no state", **error}
    items = {"type": "array", "maxItems": 20, "items": {"type": "object"}}
    metadata = {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 512}}

    def route(summary: str, said: str, params: list[dict[str, Any]],
              body: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "summary": summary, "parameters": [user, *params],
            "responses": {"200": {"description": said, "content": {"application/json": {}}},
                          "400": {"description": "A field is invalid; the message names it", **error},
                          "404": missing, "503": down}}
        if body is not None:
            out["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": body, "additionalProperties": False}}}}
        return out

    paths["/v1/conversations"] = {"post": route("Create a conversation, with up to 20 items", "The conversation",
                                                [], {"items": items, "metadata": metadata})}
    paths["/v1/conversations/{conversation_id}"] = {
        "get": route("A conversation", "The conversation", [conversation_id]),
        "post": route("Update a conversation's metadata", "The conversation", [conversation_id],
                      {"metadata": metadata}),
        "delete": route("Delete a conversation and its items", "{id, object: conversation.deleted, deleted: true}",
                        [conversation_id])}
    paths["/v1/conversations/{conversation_id}/items"] = {
        "get": route("A conversation's items", "A list: data, first_id, last_id, has_more",
                     [conversation_id, *query]),
        "post": route("Add up to 20 items to a conversation", "The items added, as a list", [conversation_id],
                      {"items": items})}
    paths["/v1/conversations/{conversation_id}/items/{item_id}"] = {
        "get": route("One item of a conversation", "The item", [conversation_id, item_id]),
        "delete": route("Delete an item of a conversation", "The conversation", [conversation_id, item_id])}


def _untag(schema: dict[str, Any]) -> None:
    """Drop the discriminators (which require `type`) from the item unions under `schema`."""
    for branch in schema.get("anyOf", ()):
        branch.get("items", {}).pop("discriminator", None)


def _post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    return {"summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "The answer (JSON), or its events (SSE) when `stream`",
                                  "content": {"application/json": {}, "text/event-stream": {}}},
                          "400": {"description": "A field is invalid; the message names it", **error},
                          "404": {"description": "Unknown model", **error},
                          "429": {"description": "Every replica is at its in-flight cap", **error}}}


def _get(summary: str) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": summary, "content": {"application/json": {}}}}}
