"""A request's prompt token ids as the frontend makes them, for the precise_prefix policy (router
process): a chat body rendered with the model's chat template and tokenized, a completions prompt
tokenized, each with the frontend's defaults. This reproduces services/frontend/requests/translator.py
(Preparer.chat and .completion) and messages.template_messages, since services never import each
other; tests/unit/router/test_prompt.py checks both give the same ids. A body the frontend would
refuse gives no ids (the policy then routes by load, and the frontend answers the 400)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tokenizers import Tokenizer

import checkpoints
from services.router.chat_template import ChatTemplate, TemplateError

ROLES = ("system", "developer", "user", "assistant", "tool")


class Unrenderable(ValueError):
    """A body whose prompt the router cannot make as the frontend would (it would refuse it)."""


@dataclass(slots=True, frozen=True)
class PromptIds:
    ids: list[int]
    salt: str | None  # the request's cache_salt: the engines start its block chain from it


class PromptModel:
    """The pool's tokenizer and chat template, loaded once at start (`load`); thread-safe."""

    __slots__ = ("max_model_len", "template", "tokenizer", "tokenizer_sha256")

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, *, tokenizer_sha256: str = "") -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.tokenizer_sha256 = tokenizer_sha256  # to compare with what the frontends serve (GetModelInfo)
        self.max_model_len: int | None = None  # the engines' (GetModelInfo): for truncate_prompt_tokens=-1

    @classmethod
    def load(cls, spec: str) -> PromptModel:
        """From checkpoint `spec` (a --model value, as the frontend's): tokenizer.json and the template."""
        path = Path(checkpoints.resolve(spec))
        raw = (path / "tokenizer.json").read_bytes()
        return cls(Tokenizer.from_str(raw.decode()), ChatTemplate.from_checkpoint(path),
                   tokenizer_sha256=hashlib.sha256(raw).hexdigest())

    def prompt_now(self, body: dict[str, Any]) -> PromptIds:
        """The ids of `body` (a chat or completions body); raises Unrenderable. Thread-safe: minijinja and
        encode_batch_fast release the GIL while they work, so a long body is best made in a worker thread."""
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise Unrenderable("cache_salt is not a string")
        if "messages" in body:
            ids = self._chat(body)
        elif "prompt" in body:
            ids = self._completion(body["prompt"], _flag(body, "add_special_tokens", True))
        else:
            raise Unrenderable("neither messages nor prompt")
        return PromptIds(self._truncated(ids, body), salt)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # encode_batch_fast releases the GIL (encode holds it throughout) and skips the offsets; the ids
        # are encode's.
        ids: list[int] = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        return ids

    def _chat(self, body: dict[str, Any]) -> list[int]:
        messages = body["messages"]
        if not isinstance(messages, list):
            raise Unrenderable("messages is not a list")
        tools = body.get("tools")
        try:
            text = self.template.render([_message(m) for m in messages], tools=tools,
                                        add_generation_prompt=_flag(body, "add_generation_prompt", True),
                                        continue_final_message=_flag(body, "continue_final_message", False),
                                        chat_template_kwargs=_template_kwargs(body))
        except TemplateError as exc:
            raise Unrenderable(f"chat template: {exc}") from None
        return self.encode(text, add_special_tokens=_flag(body, "add_special_tokens", False))

    def _completion(self, prompt: Any, add_special_tokens: bool) -> list[int]:
        # A batch is one engine request per prompt; the first one stands for the body.
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return self.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return prompt
        raise Unrenderable("prompt is not a non-empty string or list of token ids")

    def _truncated(self, ids: list[int], body: dict[str, Any]) -> list[int]:
        """truncate_prompt_tokens as the frontend applies it (translation._truncated)."""
        keep, side = body.get("truncate_prompt_tokens"), body.get("truncation_side")
        if keep is None:
            return ids
        if type(keep) is not int or keep == 0 or keep < -1:
            raise Unrenderable("truncate_prompt_tokens is not -1 or >= 1")
        if keep == -1:
            if self.max_model_len is None:
                raise Unrenderable("truncate_prompt_tokens=-1 before the engines' max_model_len is known")
            keep = self.max_model_len - 1
        if len(ids) <= keep:
            return ids
        return ids[:keep] if side == "right" else ids[len(ids) - keep:]


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise Unrenderable(f"{key} is not a boolean")
    return value


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """chat_template_kwargs with `documents` and `reasoning_effort` (translation._template_kwargs)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        _refuse("chat_template_kwargs")
    documents, effort = body.get("documents"), body.get("reasoning_effort")
    if documents is None and effort is None:
        return kwargs
    kwargs = dict(kwargs or {})
    if documents is not None:
        kwargs["documents"] = documents
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def _refuse(field: str) -> NoReturn:
    raise Unrenderable(f"{field} has a shape the frontend refuses")


def _message(message: Any) -> dict[str, Any]:
    """A message as the template sees it (messages._message): role, content as text, and the
    assistant's tool calls (arguments parsed from their JSON string) and reasoning."""
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        _refuse("messages[].role")
    role = message["role"]
    d: dict[str, Any] = {"role": role, "content": _content(message.get("content"))}
    calls = message.get("tool_calls")
    if role == "assistant":
        if calls:
            if not isinstance(calls, list):
                _refuse("tool_calls")
            d["tool_calls"] = [_tool_call(call) for call in calls]
        if message.get("reasoning_content") is not None:
            d["reasoning_content"] = message["reasoning_content"]
    elif calls is not None:
        _refuse("tool_calls")
    if role == "tool" and message.get("tool_call_id") is not None:
        d["tool_call_id"] = message["tool_call_id"]
    if message.get("name") is not None:
        d["name"] = message["name"]
    return d


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _refuse("content")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            _refuse("content[]")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        _refuse("tool_calls[]")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        _refuse("tool_calls[].function")
    arguments = function.get("arguments")
    if arguments is None or arguments == "":
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            _refuse("tool_calls[].function.arguments")
    if not isinstance(arguments, dict):
        _refuse("tool_calls[].function.arguments")
    return {**call, "function": {**function, "arguments": arguments}}
