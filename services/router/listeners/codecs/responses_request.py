"""The OpenAI Responses API's request as an upstream chat completions body, run in the router: input
items (messages, function calls and their outputs, reasoning) as chat messages, function tools, tool
choice and reasoning options, and the sampling extras vLLM's own Responses API takes. Every other field
is refused by name. Pure; CodecError names what cannot be carried."""
from __future__ import annotations

from typing import Any

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

_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          # Most chat templates know no "developer" role; it means what "system" means there.
          "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed")
# vLLM's Responses extras carried to upstream's chat body under the same name (request_fields.SAMPLING).
_CARRIED = ("stop", "top_k", "min_p", "seed", "logit_bias", "structured_outputs", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "stop_token_ids", "ignore_eos", "skip_special_tokens",
            "include_stop_str_in_output", "cache_salt", "priority")
_FIELDS = frozenset((
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "reasoning", "text", "tools",
    "tool_choice", "parallel_tool_calls", "stream", "top_logprobs", "include", "chat_template_kwargs",
    # Echoed in the response, or no change to the answer: store, service_tier and the like are accepted.
    "metadata", "user", "store", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options",
    # Honoured when the router keeps response state (listeners/responses_api.py), else refused there.
    "previous_response_id", "conversation",
    # Refused when set to anything that would change the answer (_refuse_unsupported).
    "prompt", "background", "truncation",
    *_CARRIED))
_NOT_HERE = "is not supported by this router"
_REFUSED = {name: _NOT_HERE for name in (
    "max_tool_calls", "request_id", "session_id", "media_io_kwargs", "mm_processor_kwargs", "mm_payload",
    "return_mm_kwargs", "enable_response_messages", "previous_input_messages", "vllm_xargs", "kv_transfer_params",
    "ec_transfer_params", "watermarking")}
# What include may ask: output logprobs (honoured), and what this server has none of to include.
_INCLUDES = ("message.output_text.logprobs", "reasoning.encrypted_content", "code_interpreter_call.outputs",
             "computer_call_output.output.image_url", "file_search_call.results", "message.input_image.image_url",
             "web_search_call.action.sources")
LOGPROBS = "message.output_text.logprobs"
# Upstream's chat fields as this API names them, for upstream's refusals.
RENAMES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format", "reasoning_effort": "reasoning.effort", "messages": "input",
           "logprobs": "top_logprobs"}


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body as a chat completions body; CodecError names what cannot be carried."""
    model = checked_model(body, _refuse_unsupported)
    _check_echoed(body)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise CodecError("instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    messages.extend(input_messages(body.get("input")))
    if not messages:  # upstream would refuse its empty `messages`, a field this client never sent
        raise CodecError("input", "carries no message: a reasoning item alone (no text, no calls) is dropped")
    chat: dict[str, Any] = {"model": model, "messages": messages}
    _ask_tools(body, chat)
    max_out = body.get("max_output_tokens")
    if max_out is not None:
        chat["max_tokens"] = whole(max_out, "max_output_tokens", 1)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            chat[name] = number(value, name)
    carry(body, chat, _CARRIED)
    _ask_logprobs(body, chat)
    carry(body, chat, ("chat_template_kwargs",))  # before the reasoning options, which add to it
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise CodecError("reasoning", "must be an object")
        check_fields(reasoning, ("effort", "summary", "generate_summary"), {}, "reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            if effort not in _EFFORTS:
                raise CodecError("reasoning.effort", f"must be one of {list(_EFFORTS)}")
            chat["reasoning_effort"] = effort
        # summary is accepted and not produced: reasoning comes back as its text, with summary [].
        for name in ("summary", "generate_summary"):
            if reasoning.get(name) not in (None, *_SUMMARIES):
                raise CodecError(f"reasoning.{name}", f"must be one of {list(_SUMMARIES)}")
    _ask_format(body, chat)
    if "structured_outputs" in chat and "response_format" in chat:  # as vLLM refuses them together
        raise CodecError("structured_outputs", "cannot be set together with text.format")
    ask_stream(body, chat)
    return chat


def _ask_logprobs(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Output logprobs, asked by include's message.output_text.logprobs or by top_logprobs > 0, as chat's
    logprobs + top_logprobs; they come back in each output_text part's `logprobs`."""
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(name, str) for name in include):
            raise CodecError("include", "must be a list of strings")
        for i, name in enumerate(include):
            if name not in _INCLUDES:
                raise CodecError(f"include[{i}]", f"must be one of {list(_INCLUDES)}")
    top = body.get("top_logprobs")
    top = 0 if top is None else whole(top, "top_logprobs", 0)
    if top > 20:
        raise CodecError("top_logprobs", "must be an integer in [0, 20]")
    if top or (include and LOGPROBS in include):
        chat["logprobs"] = True
        chat["top_logprobs"] = top


def wants_logprobs(request: dict[str, Any]) -> bool:
    """Whether the answer carries output logprobs (as _ask_logprobs asked upstream for them)."""
    include = request.get("include")
    return bool(request.get("top_logprobs")) or (isinstance(include, list) and LOGPROBS in include)


_FORMATS = ("text", "json_object", "json_schema")


def _ask_format(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """text.format as chat's response_format: json_object and json_schema (name, schema, strict,
    description), which the frontend passes to the engine's structured output or refuses by name."""
    text = body.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise CodecError("text", "must be an object")
    check_fields(text, ("format",), {"verbosity": _NOT_HERE}, "text")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise CodecError("text.format", f"must be an object with a type, one of {list(_FORMATS)}")
    kind = fmt.get("type")
    if kind not in _FORMATS:
        raise CodecError("text.format.type", f"must be one of {list(_FORMATS)}")
    check_fields(fmt, ("type", "name", "schema", "strict", "description") if kind == "json_schema" else ("type",),
                 {}, "text.format")
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        name, schema, strict = fmt.get("name"), fmt.get("schema"), fmt.get("strict")
        if not isinstance(name, str) or not name:
            raise CodecError("text.format.name", "is required: a non-empty string")
        if not isinstance(schema, dict):
            raise CodecError("text.format.schema", "is required: a JSON Schema object")
        if strict is not None and not isinstance(strict, bool):
            raise CodecError("text.format.strict", "must be a boolean")
        spec: dict[str, Any] = {"name": name, "schema": schema}
        if strict is not None:
            spec["strict"] = strict
        description = fmt.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise CodecError("text.format.description", "must be a string")
            spec["description"] = description
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields that would change the answer if dropped silently; store, service_tier and the like are ignored."""
    check_fields(body, _FIELDS, _REFUSED)
    if body.get("prompt"):
        raise CodecError("prompt", "is not supported: this server stores no prompts")
    if body.get("background"):
        raise CodecError("background", "background responses are not supported by this server")
    if body.get("truncation") not in (None, "disabled"):
        raise CodecError("truncation", "only 'disabled' is supported")


def _check_echoed(body: dict[str, Any]) -> None:
    """Fields not carried upstream: echoed in the response object, whose shape the SDKs check, or of no
    effect on the answer; each still of its type."""
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise CodecError("metadata", "must be an object of string values")
    for name, kind, noun in (("user", str, "a string"), ("service_tier", str, "a string"),
                             ("prompt_cache_key", str, "a string"), ("safety_identifier", str, "a string"),
                             ("store", bool, "a boolean"), ("stream_options", dict, "an object"),
                             ("previous_response_id", str, "a string (a response's id)")):
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise CodecError(name, f"must be {noun}")
    conversation = body.get("conversation")
    if conversation is not None and not isinstance(conversation, str) and not (
            isinstance(conversation, dict) and isinstance(conversation.get("id"), str)):
        raise CodecError("conversation", "must be a conversation id, or an object with its `id` (a string)")


def _ask_tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Function tools, tool_choice and parallel_tool_calls in chat's shape; other tool types are refused."""
    names = set()
    for i, tool in enumerate(tool_list(body)):
        if not isinstance(tool, dict):
            raise CodecError(f"tools[{i}]", "must be a tool object")
        kind = tool.get("type")
        if kind != "function":
            raise CodecError(f"tools[{i}].type", f"tool type {kind!r} is not supported; only 'function'")
        check_fields(tool, ("type", "name", "description", "parameters", "strict"), {}, f"tools[{i}]")
        function = chat_function(tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]")
        strict = tool.get("strict")
        if strict is not None:
            if not isinstance(strict, bool):
                raise CodecError(f"tools[{i}].strict", "must be a boolean")
            function["function"]["strict"] = strict
        names.add(function["function"]["name"])
        chat.setdefault("tools", []).append(function)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise CodecError("tool_choice.type", "must be 'function' (or tool_choice one of 'none', 'auto', "
                               "'required')")
        check_fields(choice, ("type", "name"), {}, "tool_choice")
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise CodecError("tool_choice.name", f"must name a function in tools, got {name!r}")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif choice == "required":
        if not names:
            raise CodecError("tool_choice", "'required' needs at least one tool")
        chat["tool_choice"] = choice
    elif choice in ("auto", "none"):
        if names:
            chat["tool_choice"] = choice
    elif choice is not None:
        raise CodecError("tool_choice", "must be 'none', 'auto', 'required' or {'type': 'function', 'name'}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise CodecError("parallel_tool_calls", "must be a boolean")
        if names:
            chat["parallel_tool_calls"] = parallel


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Input items (or a string) as chat messages; also how a stored response's output items are carried
    into the next call (reasoning, message and function call items are valid input items)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise CodecError("input", "must be a string or a non-empty list of messages")
    messages: list[dict[str, Any]] = []
    # The assistant turn being built: a reasoning item, an assistant message and the function calls that
    # follow them are one chat message, as the model produced them in one turn.
    turn: dict[str, Any] | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise CodecError(where, "must be a message object")
        kind = item.get("type", "message")
        if kind == "function_call":
            if turn is None:
                turn = {"role": "assistant", "content": None}
            turn.setdefault("tool_calls", []).append(_function_call(item, where))
            continue
        if kind == "reasoning":
            turn = _new_turn(messages, turn)
            text = _reasoning_input(item, where)
            if text:
                turn["reasoning_content"] = text
            continue
        if kind == "function_call_output":
            _close_turn(messages, turn)
            turn = None
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise CodecError(f"{where}.call_id", "a call id (non-empty string) is required")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _content(item.get("output"), f"{where}.output")})
            continue
        if kind != "message":
            raise CodecError(f"{where}.type", f"input items of type {kind!r} are not supported; only message, "
                               "function_call, function_call_output and reasoning")
        role = item.get("role")
        role = _ROLES.get(role) if isinstance(role, str) else None
        if role is None:
            raise CodecError(f"{where}.role", f"must be one of {sorted(_ROLES)}")
        content = _content(item.get("content"), f"{where}.content")
        if role == "assistant" and turn is not None and turn["content"] is None and "tool_calls" not in turn:
            turn["content"] = content  # the message after its reasoning item
            continue
        _close_turn(messages, turn)
        turn = None
        if role == "assistant":  # the function calls that follow join it
            turn = {"role": role, "content": content}
        else:
            messages.append({"role": role, "content": content})
    _close_turn(messages, turn)
    return messages


def _new_turn(messages: list[dict[str, Any]], turn: dict[str, Any] | None) -> dict[str, Any]:
    _close_turn(messages, turn)
    return {"role": "assistant", "content": None}


def _close_turn(messages: list[dict[str, Any]], turn: dict[str, Any] | None) -> None:
    """The assistant turn into the messages; reasoning alone (no text, no calls) is dropped, as there is
    no assistant message of chat's to carry it."""
    if turn is not None and (turn["content"] is not None or turn.get("tool_calls")):
        messages.append(turn)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    values = []
    for name in ("call_id", "name", "arguments"):
        value = item.get(name)
        if not isinstance(value, str) or (not value and name != "arguments"):
            raise CodecError(f"{where}.{name}", "is required: a string")
        values.append(value)
    return chat_call(*values)


def _reasoning_input(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text (its reasoning_text content, else its summary); encrypted content, which
    only OpenAI can read, is ignored."""
    for name, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(name) or []
        if not isinstance(parts, list):
            raise CodecError(f"{where}.{name}", "must be a list")
        texts = []
        for j, part in enumerate(parts):
            at = f"{where}.{name}[{j}]"
            if not isinstance(part, dict):
                raise CodecError(at, f"must be a {kind!r} part object")
            if part.get("type") != kind:
                raise CodecError(f"{at}.type", f"must be {kind!r}")
            if not isinstance(part.get("text"), str):
                raise CodecError(f"{at}.text", "must be a string")
            texts.append(part["text"])
        if texts:
            return "".join(texts)
    return ""


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    return text_parts(content, where, _TEXT_PARTS, "content part")
