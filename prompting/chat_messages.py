"""Chat messages as sent (OpenAI shapes, as decoded JSON) made into the dicts chat templates expect, and
the template arguments a chat request adds, once per request.

Follows vLLM's chat_utils: content null -> "", text parts joined with "\\n", assistant tool-call
arguments JSON-decoded into a dict (HF templates format a dict, and print a string as it is), empty
tool_calls dropped, fields a role does not use dropped. Unlike vLLM, arguments that are not a JSON object
are refused rather than coerced to {}. Every shape it cannot take raises PromptError naming the field.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from prompting.errors import refuse

ROLES = ("system", "developer", "user", "assistant", "tool")
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The conversation for `ChatTemplate.render`, from the request's `messages` as decoded JSON."""
    return [_message(f"messages[{i}]", m) for i, m in enumerate(messages)]


def template_kwargs(chat_template_kwargs: Any, *, documents: Any = None,
                    reasoning_effort: Any = None) -> dict[str, Any] | None:
    """chat_template_kwargs with the request fields vLLM passes to the template: `documents`, and
    `reasoning_effort` (with `enable_thinking` false for "none", true otherwise, unless the kwargs set it)."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise refuse("chat_template_kwargs", f"must be an object, got {_kind(chat_template_kwargs)}")
    if documents is None and reasoning_effort is None:
        return chat_template_kwargs
    kwargs = dict(chat_template_kwargs or {})
    if documents is not None:
        kwargs["documents"] = documents
    if reasoning_effort is not None:
        kwargs["reasoning_effort"] = reasoning_effort
        kwargs.setdefault("enable_thinking", reasoning_effort != "none")
    return kwargs


def _message(where: str, message: Any) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise refuse(where, f"must be an object, got {_kind(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise refuse(f"{where}.role", f"{role!r} is not one of: {', '.join(ROLES)}")
    d: dict[str, Any] = {"role": role, "content": _content(where, message.get("content"))}
    calls = message.get("tool_calls")
    if role == "assistant":
        if calls:  # [] is dropped, so templates take their plain assistant path
            if not isinstance(calls, list):
                raise refuse(f"{where}.tool_calls", f"must be an array, got {_kind(calls)}")
            d["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", call) for j, call in enumerate(calls)]
        if message.get("reasoning_content") is not None:
            d["reasoning_content"] = message["reasoning_content"]
    elif calls is not None:
        raise refuse(f"{where}.tool_calls", f"only assistant messages carry tool calls, not {role!r} ones")
    if role == "tool" and message.get("tool_call_id") is not None:
        d["tool_call_id"] = message["tool_call_id"]
    if message.get("name") is not None:
        d["name"] = message["name"]
    return d


def _content(where: str, content: Any) -> str:
    if content is None:  # as vLLM: an assistant beside tool_calls, or any message sent without text
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(f"{where}.content", f"must be a string or an array of content parts, got {_kind(content)}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise refuse(f"{where}.content[{j}]", "only text content parts are supported")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise refuse(where, f"must be an object, got {_kind(call)}")
    kind = call.get("type", "function")
    if kind != "function":
        raise refuse(f"{where}.type", f'{kind!r} is not supported: the only tool call type is "function"')
    if not isinstance(call.get("id", ""), str):
        raise refuse(f"{where}.id", "must be a string")
    function = call.get("function")
    if not isinstance(function, Mapping):
        raise refuse(f"{where}.function", 'required: an object {"name": string, "arguments": JSON object string}')
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise refuse(f"{where}.function.name", "required: a non-empty string")
    arguments = _arguments(f"{where}.function.arguments", function.get("arguments"))
    return {**call, "function": {**function, "arguments": arguments}}


def _arguments(field: str, value: Any) -> dict[str, Any]:
    if value is None or value == "":  # as vLLM: a call without arguments is called with {}
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise refuse(field, f"must be a JSON object encoded as a string, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise refuse(field, f"must be a JSON object encoded as a string; it is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise refuse(field, f"must be a JSON object encoded as a string, got a JSON {_JSON_TYPES[type(parsed)]}")
    return parsed


def _kind(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)
