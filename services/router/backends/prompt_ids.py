"""A request's prompt token ids as the frontend makes them, for the precise_prefix policy (router
process): a chat body rendered with the model's chat template and tokenized, a completions prompt
tokenized, each with the frontend's defaults. The template, the messages' normalization, the template
arguments and truncation are the shared prompting library's, as the frontend's are; the body's other
fields are read here as the frontend's schema reads them (tests/unit/router/test_prompt.py checks both
give the same ids). A body the frontend would refuse gives no ids (the policy then routes by load, and
the frontend answers the 400)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

import checkpoints
from prompting.chat_messages import template_kwargs, template_messages
from prompting.chat_template import ChatTemplate, TemplateError
from prompting.errors import PromptError
from prompting.model_files import load_tokenizer
from prompting.truncation import truncated


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
        path = checkpoints.resolve(spec)
        loaded = load_tokenizer(path)
        return cls(loaded.tokenizer, ChatTemplate.from_checkpoint(path), tokenizer_sha256=loaded.sha256)

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
            text = self.template.render(template_messages(messages), tools=tools,
                                        add_generation_prompt=_flag(body, "add_generation_prompt", True),
                                        continue_final_message=_flag(body, "continue_final_message", False),
                                        chat_template_kwargs=template_kwargs(
                                            body.get("chat_template_kwargs"), documents=body.get("documents"),
                                            reasoning_effort=body.get("reasoning_effort")))
        except TemplateError as exc:
            raise Unrenderable(f"chat template: {exc}") from None
        except PromptError as exc:
            raise Unrenderable(str(exc)) from None
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
        try:
            return truncated(ids, body.get("truncate_prompt_tokens"), body.get("truncation_side"), self.max_model_len)
        except PromptError as exc:
            raise Unrenderable(str(exc)) from None


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise Unrenderable(f"{key} is not a boolean")
    return value
