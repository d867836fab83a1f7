"""POST /tokenize and POST /detokenize in vLLM's shapes: the request structs and the work on the
tokenizer and chat template. Run by translation's Preparer in each API server process, on its event
loop for short bodies and in a worker process for long ones (workers.py), so it pickles small: the
token ids come back already JSON-encoded."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.json_body import check_entry, decode, parse
from services.frontend.requests.openai_schema import ChatMessage
from services.frontend.requests.tools import check_tools

_json = msgspec.json.Encoder()


class TokenizeCompletionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The chat form: rendered with the chat template as /v1/chat/completions renders it."""

    messages: list[ChatMessage]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # As vLLM: the template adds what special tokens it needs, so by default none are added on top.
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None  # refused: vLLM takes one only with --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    media_io_kwargs: dict[str, Any] | None = None  # multimodal: refused, the frontend serves text
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None


class _Form(msgspec.Struct):
    """Which form a /tokenize body is: the chat form has `messages` (vLLM tells them apart so)."""

    messages: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_form = msgspec.json.Decoder(_Form)


@dataclass(slots=True, frozen=True)
class Tokenized:
    """A /tokenize answer but for max_model_len, which the event loop knows (the engines say it)."""

    count: int
    tokens: bytes  # the JSON array of ids
    token_strs: bytes | None  # the JSON array of their strings, when asked
    adapter: str | None = None  # the LoRA adapter named as the model (its tokenizer is the base model's)

    def body(self, max_model_len: int) -> bytes:
        return (b'{"count":' + str(self.count).encode() + b',"max_model_len":' + str(max_model_len).encode()
                + b',"tokens":' + self.tokens + b',"token_strs":' + (self.token_strs or b"null") + b"}")


# (messages, tools, add_generation_prompt, continue_final_message, chat_template_kwargs) -> prompt text,
# with the chat endpoint's checks and errors (preparer.Preparer.render).
Render = Callable[[list[ChatMessage], list[dict[str, Any]] | None, bool, bool, dict[str, Any] | None], str]


def tokenize(model: Model, body: bytes, render: Render) -> Tokenized:
    """A /tokenize body, either form, checked and tokenized."""
    check_entry(body)  # before the form is looked for: that is a decode too
    try:
        chat = _form.decode(body).messages is not msgspec.UNSET
    except (msgspec.DecodeError, msgspec.ValidationError):
        chat = False  # not an object: decode() below says why, as for the other routes
    if chat:
        req: TokenizeChatRequest = decode(TokenizeChatRequest, body)
        named = req.model
        if req.chat_template is not None:
            raise APIError(400, "chat_template: a chat template sent with the request is not accepted; the "
                           "model's own template renders it", param="chat_template")
        for name in ("media_io_kwargs", "mm_processor_kwargs"):
            if getattr(req, name) is not None:
                raise APIError(400, f"{name}: multimodal inputs are not supported by this server", param=name)
        check_tools(req.tools)
        text = render(req.messages, req.tools, req.add_generation_prompt, req.continue_final_message,
                      req.chat_template_kwargs)
        add_special, strs = req.add_special_tokens, req.return_token_strs
    else:
        completion: TokenizeCompletionRequest = decode(TokenizeCompletionRequest, body)
        named = completion.model
        text, add_special, strs = completion.prompt, completion.add_special_tokens, completion.return_token_strs
    encoding = model.tokenizer.encode(text, add_special_tokens=add_special)
    return Tokenized(len(encoding.ids), _json.encode(encoding.ids), _json.encode(encoding.tokens) if strs else None,
                     adapter(model, named))


def detokenize(model: Model, body: bytes) -> tuple[bytes, str | None]:
    """A /detokenize body, checked; the answer's JSON: the text of the ids, special tokens kept (as vLLM),
    and the LoRA adapter named as the model, if one."""
    req: DetokenizeRequest = parse(DetokenizeRequest, body)
    vocab = model.vocab_size
    if req.tokens and not (0 <= min(req.tokens) and max(req.tokens) < vocab):
        i, bad = next((i, t) for i, t in enumerate(req.tokens) if not 0 <= t < vocab)
        raise APIError(400, f"tokens[{i}]: token id {bad} is out of range [0, {vocab})", param=f"tokens[{i}]")
    return _json.encode({"prompt": model.tokenizer.decode(req.tokens, skip_special_tokens=False)}), adapter(
        model, req.model)


def adapter(model: Model, name: str | None) -> str | None:
    """`model` may be left out (vLLM's preprocessing routes); another name than the base model's may be a
    LoRA adapter's, which the caller checks with the engines (translator.Translator)."""
    return None if name is None or name == model.name else name
