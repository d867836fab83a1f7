"""The part of translation that needs no engine state: a body parsed, checked, rendered and tokenized
into a Prepared, on the API server's event loop for short bodies and in a worker process for long ones
(workers.py; the entry points at the end run there), with /tokenize's and /detokenize's work."""
from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from prompting.chat_messages import template_kwargs
from prompting.chat_template import TemplateError
from services.frontend.errors import APIError
from services.frontend.model import NO_CHAT_TEMPLATE, Model
from services.frontend.requests import refusals, token_in, tokenization
from services.frontend.requests.chat_messages import template_messages
from services.frontend.requests.json_body import parse
from services.frontend.requests.openai_schema import (
    CHAT_BOUNDS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    check_bounds,
    check_common,
    check_logprobs,
)
from services.frontend.requests.structured import Constraint, constraint
from services.frontend.requests.tokenization import Tokenized
from services.frontend.requests.tools import check_tools, forced_schema, resolve_tool_choice

DEFAULT_MAX_CHOICES = 256  # --max-request-choices: n times the prompts of one body
PROMPT_TAIL_CHARS = 4096  # of the rendered prompt, kept for the reasoning parser (not the whole prompt)


@dataclass(slots=True)
class Prepared:
    """A body with every check that needs no engine passed, rendered and tokenized. Built on the
    event loop for short bodies and in a worker process for long ones (so it pickles small: the
    request keeps no messages or prompt, the ids travel as an array)."""

    req: ChatCompletionRequest | CompletionRequest | token_in.TokenInRequest
    ids: array[int]
    chat: bool
    prompt_tail: str = ""  # chat: the rendered prompt's end
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "none"
    parallel_tool_calls: bool = True
    json_schema: str | None = None  # a forced tool_choice's schema
    constraint: Constraint | None = None  # response_format, structured_outputs or a guided_* field's
    # A completion's prompts, one or a batch: each one's ids and, when it asked for echo, its text.
    prompts: list[tuple[array[int], str | None]] | None = None
    # The LoRA adapter: a `model` other than the base model's name (the Translator checks that it is
    # served), or a gRPC GenerateRequest's lora_name. And a gRPC request's rank pin.
    lora: str | None = None
    pin: int | None = None


class Preparer:
    """Parse, check, render and tokenize: the part of translation that needs no engine state. Each
    check is made once, by one layer: `schema` decodes the body (types, required fields) and checks
    the sampling ranges; `ChatTemplate.render` checks its own options (add_generation_prompt with
    continue_final_message, a non-empty message list) for every caller; `messages.py` checks message
    shapes and `tools.py` tools and tool_choice; this class the model, unsupported features and
    prompt forms. `enable_auto_tool_choice` and `tool_call_parser`: the server's flags that
    tool_choice "auto" needs (vLLM's)."""

    def __init__(self, model: Model, *, enable_auto_tool_choice: bool = False,
                 tool_call_parser: str | None = None, max_logprobs: int = 20,
                 max_choices: int = DEFAULT_MAX_CHOICES) -> None:
        self._model = model
        self._enable_auto_tool_choice = enable_auto_tool_choice
        self._tool_call_parser = tool_call_parser
        self._max_logprobs = max_logprobs
        self._max_choices = max_choices

    def chat(self, body: bytes) -> Prepared:
        req: ChatCompletionRequest = parse(ChatCompletionRequest, body)
        check_common(req)
        check_bounds(req, CHAT_BOUNDS)
        if req.max_completion_tokens is not None:
            req.max_tokens = req.max_completion_tokens
        check_logprobs(req, self._max_logprobs)
        refusals.check_chat(req)
        self._check_choices(req.n, 1)
        tools = check_tools(req.tools)
        choice = resolve_tool_choice(req.tool_choice, tools, enable_auto_tool_choice=self._enable_auto_tool_choice,
                                     tool_call_parser=self._tool_call_parser)
        parallel = req.parallel_tool_calls is not False
        schema = None
        if choice == "required" or isinstance(choice, dict):
            schema = forced_schema(choice, tools, parallel=parallel)
        constrained = constraint(req)
        if constrained is not None and schema is not None:  # as vLLM: "either ... structured outputs or tools"
            raise APIError(400, f"{constrained.param}: a structured-output constraint cannot be combined with "
                           "tool_choice 'required' or a named function, whose calls are constrained already",
                           param=constrained.param)
        text = self.render(req.messages, req.tools, req.add_generation_prompt, req.continue_final_message,
                           template_kwargs(req.chat_template_kwargs, documents=req.documents,
                                           reasoning_effort=req.reasoning_effort))
        ids = array("l", self._model.encode(text, add_special_tokens=req.add_special_tokens))
        return Prepared(msgspec.structs.replace(req, messages=[], tools=None), ids, True, text[-PROMPT_TAIL_CHARS:],
                        tools, choice, parallel, schema, constrained, lora=tokenization.adapter(self._model, req.model))

    def completion(self, body: bytes) -> Prepared:
        req: CompletionRequest = parse(CompletionRequest, body)
        check_common(req)
        check_logprobs(req, self._max_logprobs)
        refusals.check_completion(req)
        if req.best_of is not None and req.best_of < req.n:  # OpenAI's rule
            raise APIError(400, f"best_of={req.best_of} must be >= n ({req.n})", param="best_of")
        constrained = constraint(req)
        prompt = req.prompt
        batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        prompts: list[Any] = prompt if batch else [prompt]  # type: ignore[assignment]
        self._check_choices(req.n, len(prompts))
        out = []
        for i, one in enumerate(prompts):
            ids = self._prompt_ids(one, req.add_special_tokens, f"prompt[{i}]" if batch else "prompt")
            echo = None
            if req.echo:  # as vLLM: the text as sent, or the token ids decoded
                echo = one if isinstance(one, str) else self._model.tokenizer.decode(ids.tolist(),
                                                                                    skip_special_tokens=False)
            out.append((ids, echo))
        return Prepared(msgspec.structs.replace(req, prompt=""), array("l"), False, constraint=constrained,
                        prompts=out, lora=tokenization.adapter(self._model, req.model))

    def _prompt_ids(self, prompt: Any, add_special_tokens: bool, param: str) -> array[int]:
        """One completion prompt's token ids: a string tokenized, or token ids checked."""
        if isinstance(prompt, list) and not all(type(t) is int for t in prompt):
            # Whole-number floats are the ids they name, as in vLLM (its list[int] is pydantic's, lax).
            if not all(type(t) is int or (type(t) is float and t.is_integer()) for t in prompt):
                raise APIError(400, f"{param}: expected a string or a list of token ids (a batch is a list of "
                               "those)", param=param)
            prompt = [int(t) for t in prompt]
        if isinstance(prompt, str):
            ids = array("l", self._model.encode(prompt, add_special_tokens=add_special_tokens))
        else:
            try:
                ids = array("l", prompt)
            except OverflowError:
                bad = next(t for t in prompt if not -2**63 <= t < 2**63)
                raise APIError(400, f"{param}: token id {bad} is out of range", param=param) from None
            vocab = self._model.vocab_size
            if ids and not (0 <= min(ids) and max(ids) < vocab):
                bad = next(t for t in ids if not 0 <= t < vocab)
                raise APIError(400, f"{param}: token id {bad} is out of range [0, {vocab})", param=param)
        if not ids:
            raise APIError(400, f"{param}: must not be empty", param=param)
        return ids

    def _check_choices(self, n: int, prompts: int) -> None:
        """Each choice is an engine request of its own: one body may ask for --max-request-choices."""
        if n * prompts > self._max_choices:
            what = f"n={n}" if prompts == 1 else f"{prompts} prompts x n={n}"
            raise APIError(400, f"{what} asks for {n * prompts} choices; this server allows at most "
                           f"{self._max_choices} per request (--max-request-choices)",
                           param="n" if prompts == 1 else "prompt")

    def generate(self, body: bytes) -> Prepared:
        """An /inference/v1/generate body (token ids in: nothing to render or tokenize)."""
        req: token_in.TokenInRequest = parse(token_in.TokenInRequest, body)
        ids = token_in.check(req, self._model.vocab_size, self._max_logprobs)
        return Prepared(msgspec.structs.replace(req, token_ids=[]), ids, False,
                        lora=tokenization.adapter(self._model, req.model))

    def generate_grpc(self, raw: bytes, stream: bool) -> Prepared:
        """A gRPC GenerateRequest (serialized): parsed, then checked as the token-in body it stands for."""
        from services.frontend.requests import grpc_body  # protobuf only where gRPC is served

        try:
            req = grpc_body.parse(raw)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        prepared = self.generate(grpc_body.token_in_body(req, stream=stream))
        prepared.pin = req.data_parallel_rank if req.HasField("data_parallel_rank") else None
        prepared.lora = req.lora_name or prepared.lora
        return prepared

    def tokenize(self, body: bytes) -> Tokenized:
        return tokenization.tokenize(self._model, body, self.render)

    def detokenize(self, body: bytes) -> tuple[bytes, str | None]:
        return tokenization.detokenize(self._model, body)

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
               continue_final_message: bool, chat_template_kwargs: dict[str, Any] | None) -> str:
        """The prompt text of a conversation (the chat route's and /tokenize's), errors naming the field."""
        template = self._model.template
        if template is None:
            raise APIError(400, NO_CHAT_TEMPLATE, param="messages")
        try:
            return template.render(
                template_messages(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs)
        except TemplateError as exc:
            if exc.param is not None:  # a render option of the request, not the template, is at fault
                raise APIError(400, str(exc), param=exc.param) from None
            raise APIError(400, f"chat template error: {exc}", param="messages") from None


# ---- in a worker process (workers.PreparePool) ----

_worker: Preparer | None = None


def start_worker(path: str, name: str, enable_auto_tool_choice: bool, tool_call_parser: str | None,
                  max_logprobs: int, max_choices: int) -> None:
    global _worker
    _worker = Preparer(Model.load(path, name), enable_auto_tool_choice=enable_auto_tool_choice,
                       tool_call_parser=tool_call_parser, max_logprobs=max_logprobs, max_choices=max_choices)


# What each kind of body is prepared with, on the loop or in a worker.
PREPARE: dict[str, Callable[[Preparer, bytes], Any]] = {
    "chat": Preparer.chat, "completion": Preparer.completion, "generate": Preparer.generate,
    "grpc": lambda p, raw: p.generate_grpc(raw, False), "grpc_stream": lambda p, raw: p.generate_grpc(raw, True),
    "tokenize": Preparer.tokenize, "detokenize": Preparer.detokenize}


def prepare_in_worker(kind: str, body: bytes) -> Prepared | Tokenized | bytes:
    assert _worker is not None, "the worker's initializer has run"
    result: Prepared | Tokenized | bytes = PREPARE[kind](_worker, body)
    return result
