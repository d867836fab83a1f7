"""Chat messages as sent (OpenAI shapes) made into the dicts chat templates expect, once per request.

Runs in each API server process, from `translation.py`. Follows vLLM's chat_utils: content null ->
"", text parts joined with "\\n", assistant tool-call arguments JSON-decoded into a dict (HF templates
format a dict, and print a string as it is), empty tool_calls dropped, fields a role does not use
dropped. Unlike vLLM, arguments that are not a JSON object are a 400 rather than coerced to {}.
"""
from __future__ import annotations

import json
from typing import Any

from services.frontend.errors import APIError
from services.frontend.requests.openai_schema import ChatMessage, ContentPart

ROLES = ("system", "developer", "user", "assistant", "tool")
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation for `ChatTemplate.render`; a 400 naming the field for a shape it cannot take."""
    return [_message(f"messages[{i}]", m) for i, m in enumerate(messages)]


def _refuse(field: str, problem: str) -> APIError:
    return APIError(400, f"{field}: {problem}", param=field)


def _message(where: str, message: ChatMessage) -> dict[str, Any]:
    role = message.role
    if role not in ROLES:
        raise _refuse(f"{where}.role", f"{role!r} is not one of: {', '.join(ROLES)}")
    d: dict[str, Any] = {"role": role, "content": _content(where, message.content)}
    if role == "assistant":
        if message.tool_calls:  # [] is dropped, so templates take their plain assistant path
            d["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", call)
                               for j, call in enumerate(message.tool_calls)]
        if message.reasoning_content is not None:
            d["reasoning_content"] = message.reasoning_content
    elif message.tool_calls is not None:
        raise _refuse(f"{where}.tool_calls", f"only assistant messages carry tool calls, not {role!r} ones")
    if role == "tool" and message.tool_call_id is not None:
        d["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        d["name"] = message.name
    return d


def _content(where: str, content: str | list[ContentPart] | None) -> str:
    if content is None:  # as vLLM: an assistant beside tool_calls, or any message sent without text
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise APIError(400, f"{where}.content[{j}]: only text content parts are supported",
                           param=f"{where}.content[{j}]")
        texts.append(part.text)
    return "\n".join(texts)


def _tool_call(where: str, call: dict[str, Any]) -> dict[str, Any]:
    kind = call.get("type", "function")
    if kind != "function":
        raise _refuse(f"{where}.type", f'{kind!r} is not supported: the only tool call type is "function"')
    if not isinstance(call.get("id", ""), str):
        raise _refuse(f"{where}.id", "must be a string")
    function = call.get("function")
    if not isinstance(function, dict):
        raise _refuse(f"{where}.function", 'required: an object {"name": string, "arguments": JSON object string}')
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _refuse(f"{where}.function.name", "required: a non-empty string")
    arguments = _arguments(f"{where}.function.arguments", function.get("arguments"))
    return {**call, "function": {**function, "arguments": arguments}}


def _arguments(field: str, value: Any) -> dict[str, Any]:
    if value is None or value == "":  # as vLLM: a call without arguments is called with {}
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise _refuse(field, f"must be a JSON object encoded as a string, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _refuse(field, f"must be a JSON object encoded as a string; it is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise _refuse(field, f"must be a JSON object encoded as a string, got a JSON {_JSON_TYPES[type(parsed)]}")
    return parsed
