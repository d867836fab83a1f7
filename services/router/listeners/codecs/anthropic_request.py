"""The Anthropic Messages API's request as an upstream chat completions body, run in the router:
messages and their content blocks (text, tool_use, tool_result, thinking) as chat messages, client
tools, tool choice, thinking and sampling, and vLLM's chat_template_kwargs and cache_salt. Every other
field is refused by name. Pure; CodecError names what cannot be carried."""
from __future__ import annotations

from typing import Any

import msgspec

from services.router.listeners.codecs.codec import (
    CodecError,
    ask_stream,
    chat_call,
    chat_function,
    checked_model,
    text_parts,
    tool_list,
)
from services.router.listeners.codecs.request_fields import carry, check_fields, number, whole

_json = msgspec.json.Encoder()
_FIELDS = frozenset((
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_k", "top_p",
    "tools", "tool_choice", "thinking", "chat_template_kwargs", "cache_salt",
    # No change to the answer: accepted, not carried.
    "metadata", "service_tier",
    # Refused when set (_refuse_unsupported).
    "mcp_servers", "container", "output_format", "output_config", "context_management"))
_REFUSED = {name: "is not supported by this router" for name in (
    "mm_payload", "return_mm_kwargs", "watermarking", "kv_transfer_params", "ec_transfer_params", "vllm_xargs")}
# Upstream's chat fields as this API names them, for upstream's refusals.
RENAMES = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens"}


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request body as a chat completions body; CodecError names what cannot be carried."""
    model = checked_model(body, _refuse_unsupported)
    if body.get("max_tokens") is None:
        raise CodecError("max_tokens", "is required: an integer >= 1")
    max_tokens = whole(body["max_tokens"], "max_tokens", 1)
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None and system != "":
        messages.append({"role": "system", "content": _content(system, "system")})
    messages.extend(_messages(body.get("messages")))
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    _ask_tools(body, chat)
    carry(body, chat, ("chat_template_kwargs",))  # before the reasoning options, which add to it
    _ask_thinking(body, chat, max_tokens)
    carry(body, chat, ("cache_salt",))
    if messages[-1]["role"] == "assistant":
        # A final assistant turn is a prefill: the model continues it rather than starting a new turn.
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None:
            if not low <= number(value, name) <= high:
                raise CodecError(name, f"must be a number in [{low}, {high}]")
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        top_k = whole(top_k, "top_k", 0)
        if top_k > 0:  # Anthropic's 0 and chat's absent both mean "no top-k"
            chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise CodecError("stop_sequences", "must be a list of non-empty strings")
        if stops:
            chat["stop"] = stops
    ask_stream(body, chat)
    return chat


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields that would change the answer if dropped silently; metadata, service_tier and the like are ignored."""
    check_fields(body, _FIELDS, _REFUSED)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise CodecError("metadata", "must be an object")
    if body.get("service_tier") is not None and not isinstance(body["service_tier"], str):
        raise CodecError("service_tier", "must be a string")
    for name in ("mcp_servers", "container", "output_format", "context_management"):
        if body.get(name):
            raise CodecError(name, "is not supported by this server")
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format"):
        raise CodecError("output_config.format", "structured outputs are not supported by this server")
    if isinstance(config, dict):
        check_fields(config, ("format",), {"effort": "is not supported by this server"}, "output_config")


def _ask_tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Client tools, tool_choice and disable_parallel_tool_use in chat's shape; server tools are refused."""
    names = set()
    for i, tool in enumerate(tool_list(body)):
        if not isinstance(tool, dict):
            raise CodecError(f"tools[{i}]", "must be a tool object")
        kind = tool.get("type")
        if kind not in (None, "custom"):  # Anthropic's server tools (web_search_..., bash_..., ...)
            raise CodecError(f"tools[{i}].type", f"tool type {kind!r} is not supported; only client tools")
        # cache_control is dropped: prefix caching upstream is automatic.
        check_fields(tool, ("type", "name", "description", "input_schema", "cache_control"), {}, f"tools[{i}]")
        if tool.get("cache_control") is not None and not isinstance(tool["cache_control"], dict):
            raise CodecError(f"tools[{i}].cache_control", "must be an object")
        if not isinstance(tool.get("input_schema"), dict):
            raise CodecError(f"tools[{i}].input_schema", "is required: a JSON schema object")
        function = chat_function(tool.get("name"), tool.get("description"), tool["input_schema"], f"tools[{i}]")
        names.add(function["function"]["name"])
        chat.setdefault("tools", []).append(function)
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise CodecError("tool_choice", "must be an object {'type': 'auto' | 'any' | 'tool' | 'none'}")
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise CodecError("tool_choice.type", "must be one of 'auto', 'any', 'tool', 'none'")
    check_fields(choice, ("type", "name", "disable_parallel_tool_use"), {}, "tool_choice")
    if choice.get("name") is not None and not isinstance(choice["name"], str):
        raise CodecError("tool_choice.name", "must be a string")
    if kind in ("any", "tool") and not names:
        raise CodecError("tool_choice", f"{{'type': {kind!r}}} needs at least one tool")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise CodecError("tool_choice.name", f"must name a tool in tools, got {name!r}")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif names:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    single = choice.get("disable_parallel_tool_use")
    if single is not None:
        if not isinstance(single, bool):
            raise CodecError("tool_choice.disable_parallel_tool_use", "must be a boolean")
        if single and names:
            chat["parallel_tool_calls"] = False


def _ask_thinking(body: dict[str, Any], chat: dict[str, Any], max_tokens: int) -> None:
    """Extended thinking on or off through the chat template (Qwen3's and others' `enable_thinking`);
    the budget is checked as Anthropic checks it but cannot be enforced upstream: max_tokens bounds it."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict):
        raise CodecError("thinking", "must be an object {'type': 'enabled' | 'disabled', ...}")
    kind = thinking.get("type")
    check_fields(thinking, ("type", "budget_tokens"), {}, "thinking")
    # The client's own chat_template_kwargs are kept; thinking decides enable_thinking.
    kwargs = chat.setdefault("chat_template_kwargs", {})
    if kind == "disabled":
        kwargs["enable_thinking"] = False
        return
    if kind != "enabled":
        raise CodecError("thinking.type", "only 'enabled' and 'disabled' are supported")
    budget = thinking.get("budget_tokens")
    allowed = f"must be an integer >= 1024 and < max_tokens ({max_tokens})"
    if budget is None or not 1024 <= whole(budget, "thinking.budget_tokens") < max_tokens:
        raise CodecError("thinking.budget_tokens", allowed)
    kwargs["enable_thinking"] = True


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise CodecError("messages", "is required: a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise CodecError(where, "must be a message object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise CodecError(f"{where}.role", "must be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, list) and role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        elif isinstance(content, list):
            out.extend(_user(content, f"{where}.content"))
        else:
            out.append({"role": role, "content": _content(content, f"{where}.content")})
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    """An assistant turn's blocks as one chat message: text, tool_use as tool_calls, thinking as its
    reasoning_content (the signature, which only Anthropic can check, and redacted thinking are dropped)."""
    texts: list[dict[str, str]] = []
    calls, thoughts = [], []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise CodecError(f"{where}[{j}]", "must be a content block object")
        kind = block.get("type")
        if kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise CodecError(f"{where}[{j}].id", "is required: a non-empty string")
            if not isinstance(name, str) or not name:
                raise CodecError(f"{where}[{j}].name", "is required: a non-empty string")
            if not isinstance(arguments, dict):
                raise CodecError(f"{where}[{j}].input", "is required: an object")
            calls.append(chat_call(call_id, name, _json.encode(arguments).decode()))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise CodecError(f"{where}[{j}].thinking", "must be a string")
            thoughts.append(block["thinking"])
        elif kind != "redacted_thinking":
            texts.append(_text_block(block, f"{where}[{j}]", "tool_use, thinking, redacted_thinking"))
    message: dict[str, Any] = {"role": "assistant", "content": texts if texts or not calls else None}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks in order: each tool_result a tool message, each run of text blocks a user message."""
    out: list[dict[str, Any]] = []
    texts: list[dict[str, str]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append(_tool_result(block, f"{where}[{j}]"))
        else:
            texts.append(_text_block(block, f"{where}[{j}]", "tool_result"))
    if texts or not out:
        out.append({"role": "user", "content": texts})
    return out


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A tool_result as a tool message. Chat has no error flag: an error result's text is led by "Error: "
    so that the model still reads that the call failed."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise CodecError(f"{where}.tool_use_id", "is required: a non-empty string")
    content = block.get("content", "")
    content = _content(content, f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise CodecError(f"{where}.is_error", "must be a boolean")
    if is_error:
        content = "Error: " + content if isinstance(content, str) else [{"type": "text", "text": "Error: "}, *content]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    # cache_control and citations are dropped: prefix caching upstream is automatic.
    return text_parts(content, where, ("text",), "content block")


def _text_block(block: Any, where: str, others: str) -> dict[str, str]:
    if not isinstance(block, dict):
        raise CodecError(where, "must be a content block object")
    kind = block.get("type")
    if kind != "text":
        raise CodecError(f"{where}.type", f"content block type {kind!r} is not supported here; only text, {others}")
    if not isinstance(block.get("text"), str):
        raise CodecError(f"{where}.text", "must be a string")
    return {"type": "text", "text": block["text"]}
