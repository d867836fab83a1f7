"""Request translation: an OpenAI body (or a token-in one), checked once, turned into a ready engine
request (prompt ids, sampling params, output options); and /tokenize's and /detokenize's work, which
shares its worker processes. Runs on each API server's event loop; long bodies are parsed, rendered
and tokenized in its worker processes (workers.py)."""
from __future__ import annotations

import os
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgspec

from prompting.chat_template import TemplateError
from prompting.errors import PromptError
from prompting.messages import template_kwargs
from prompting.truncation import truncated
from protocol import GenerateRequest
from protocol.block_hash import block_hashes
from services.frontend import refusals, token_in, tokenization
from services.frontend.adapters import no_such_model
from services.frontend.errors import APIError
from services.frontend.messages import template_messages
from services.frontend.model import Model
from services.frontend.parsers import (
    HARMONY_REASONING_PARSERS,
    HARMONY_TOOL_PARSERS,
    REASONING_MARKERS,
    TOOL_MARKERS,
    keeps_special_tokens,
)
from services.frontend.schema import (
    CHAT_BOUNDS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    check_bounds,
    check_common,
    check_logprobs,
    logits_controls,
    parse,
    sampling_params,
    stop_list,
)
from services.frontend.structured import Constraint, constraint
from services.frontend.tokenization import Tokenized
from services.frontend.tools import check_tools, forced_schema, resolve_tool_choice
from services.frontend.workers import PreparePool

COMPLETION_DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_CHOICES = 256  # --max-request-choices: n times the prompts of one body
PROMPT_TAIL_CHARS = 4096  # of the rendered prompt, kept for the reasoning parser (not the whole prompt)
PIN_HEADER = "X-Data-Parallel-Rank"
# Protocol minors that carry what the sim backend cannot honour: a forced tool_choice's JSON schema
# (1.2), the other structured-output constraints and the logits controls (1.3).
FORCED_TOOLS_MINOR, SAMPLING_CONTROLS_MINOR = 2, 3
LOGPROBS_MINOR = 3  # logprobs as packed arrays, and prompt_logprobs: every backend sends them from 1.3


class EngineProblem(Protocol):
    """Why some ready engine cannot give what protocol 1.<minor> carries (an older one would drop the
    fields unread) or, unless `backend` is None, is not of that backend (only the vllm backend honours
    structured outputs and the logits controls); None when every ready engine can."""

    def __call__(self, minor: int, *, backend: str | None = "vllm") -> str | None: ...


def no_engine_problem(minor: int, *, backend: str | None = "vllm") -> str | None:
    return None


@dataclass(slots=True, frozen=True)
class OutputOptions:
    """How a request's engine outputs become its response (for output processing and the writers)."""

    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool  # every chunk carries the usage so far (vLLM's continuous_usage_stats)
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    tools: tuple[dict[str, Any], ...] = ()  # checked, as the request gave them
    tool_choice: str | dict[str, Any] = "none"  # "none", "auto", "required" or a named-function dict
    parallel_tool_calls: bool = True
    tool_parser: str | None = None  # the --tool-call-parser when this request's tool_choice is "auto"
    reasoning_parser: str | None = None  # the --reasoning-parser, for chat
    prompt_tail: str = ""  # the rendered prompt's end: whether the template opened the reasoning
    token_out: bool = False  # /inference/v1/generate: the response carries token ids (vLLM's shape)
    text_out: bool = False  # ... and their text as well (its return_text)
    response_id: str = ""  # the id the response names, when it is not the engine request's (the caller's)
    logprobs: int | None = None  # alternatives shown per generated token; None: no logprobs
    prompt_logprobs: int | None = None  # the engine's prompt_logprobs: the response's prompt_logprobs
    echo: str | None = None  # completions' echo: the prompt's text, returned before the completion
    return_tokens_as_token_ids: bool = False  # logprobs' tokens as "token_id:N" (vLLM's)
    # The request field an engine's refusal of `sampling.<name>` is about: where the structured-output
    # constraint came from (tool_choice, response_format, ...); other sampling fields keep their name,
    # after `param_prefix` ("sampling_params." on the token-in route).
    constraint_param: str | None = None
    param_prefix: str = ""
    # Tokens per streamed chunk (vLLM's stream_interval): the server's, or the request's if larger.
    stream_interval: int = 1


@dataclass(slots=True, frozen=True)
class EngineRequest:
    """A checked request for one prompt, ready to place: the message for the engine, how to present
    its outputs, and `n`, the choices sampled from the prompt (choices(): one engine request each)."""

    request: GenerateRequest
    max_tokens: int
    output: OutputOptions
    n: int = 1

    def choices(self) -> list[EngineRequest]:
        """One engine request per choice, as vLLM fans `n` out: ids `<id>-<j>`, and with a seed choice j
        samples with seed + j (wrapped to 64 bits), so the choices differ and each is reproducible."""
        if self.n == 1:
            return [self]
        out = []
        sampling = self.request.sampling
        for j in range(self.n):
            seeded = sampling
            if sampling.seed is not None:
                seed = (sampling.seed + j + 2**63) % 2**64 - 2**63
                seeded = msgspec.structs.replace(sampling, seed=seed)
            child = msgspec.structs.replace(self.request, request_id=f"{self.request.request_id}-{j}", sampling=seeded)
            out.append(EngineRequest(child, self.max_tokens, self.output))
        return out

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    def block_hashes(self, block_size: int) -> list[int]:
        """The prompt's chained block hashes, as the engines' KV events name their blocks."""
        return block_hashes(self.request.prompt_token_ids, block_size, salt=self.request.cache_salt,
                            lora=self.request.lora)


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
                           _template_kwargs(req))
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
            raise APIError(400, f"{param}: expected a string or a list of token ids (a batch is a list of "
                           "those)", param=param)
        if isinstance(prompt, str):
            ids = array("l", self._model.encode(prompt, add_special_tokens=add_special_tokens))
        else:
            try:
                ids = array("l", prompt)
            except OverflowError:
                bad = next(t for t in prompt if not -2**63 <= t < 2**63)
                raise APIError(400, f"{param}: token id {bad} is out of range", param=param) from None
            vocab = self._model.tokenizer.get_vocab_size(with_added_tokens=True)
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
        ids = token_in.check(req, self._model.tokenizer.get_vocab_size(with_added_tokens=True), self._max_logprobs)
        return Prepared(msgspec.structs.replace(req, token_ids=[]), ids, False,
                        lora=tokenization.adapter(self._model, req.model))

    def generate_grpc(self, raw: bytes, stream: bool) -> Prepared:
        """A gRPC GenerateRequest (serialized): parsed, then checked as the token-in body it stands for."""
        from services.frontend import grpc_body  # protobuf only where gRPC is served

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
        try:
            return self._model.template.render(
                template_messages(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs)
        except TemplateError as exc:
            if exc.param is not None:  # a render option of the request, not the template, is at fault
                raise APIError(400, str(exc), param=exc.param) from None
            raise APIError(400, f"chat template error: {exc}", param="messages") from None



class Translator:
    """One per API server process: a Preparer's work (on the event loop for bodies up to
    `long_prompt_chars`, in `max_concurrent_tokenizations` worker processes past it: rendering and
    tokenizing hold the GIL, so a worker thread would stall every stream; see docs/frontend.md), then
    the checks that need the engines. `max_model_len` answers for the engines (503 while none has
    handshaken); it is asked only once the body has passed its own checks, so a bad body is a 400
    even then. `render_max_model_len` answers for the render routes, which need no engine (default:
    `max_model_len`). `engine_problem`: why the ready engines cannot give what a request asks
    (EngineProblem); `max_logprobs`: the server's --max-logprobs."""

    def __init__(self, model: Model, max_model_len: Callable[[], int], *, long_prompt_chars: int,
                 max_concurrent_tokenizations: int, enable_auto_tool_choice: bool = False,
                 tool_call_parser: str | None = None, reasoning_parser: str | None = None,
                 engine_problem: EngineProblem = no_engine_problem, max_logprobs: int = 20,
                 render_max_model_len: Callable[[], int] | None = None,
                 max_choices: int = DEFAULT_MAX_CHOICES, stream_interval: int = 1,
                 check_adapter: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self._stream_interval = stream_interval  # the server's --stream-interval
        self._check_adapter = check_adapter or _no_adapters
        self._model = model
        self._render_max_model_len = render_max_model_len or max_model_len
        self._engine_problem = engine_problem
        self._reasoning_parser = reasoning_parser
        self._tool_call_parser = tool_call_parser
        self._preparer = Preparer(model, enable_auto_tool_choice=enable_auto_tool_choice,
                                  tool_call_parser=tool_call_parser, max_logprobs=max_logprobs,
                                  max_choices=max_choices)
        # Whether a parser's tags are special tokens of this tokenizer: its requests keep them.
        self._tool_tags_special = keeps_special_tokens(TOOL_MARKERS, tool_call_parser, model.special_tokens)
        self._reasoning_tags_special = keeps_special_tokens(REASONING_MARKERS, reasoning_parser, model.special_tokens)
        # gpt-oss: every chat output is harmony messages, read by token id (parsers/harmony.py).
        self._harmony = tool_call_parser in HARMONY_TOOL_PARSERS or reasoning_parser in HARMONY_REASONING_PARSERS
        self._max_model_len = max_model_len
        self._long_prompt_chars = long_prompt_chars
        self._workers = PreparePool(max_concurrent_tokenizations, _start_worker,
                                    (str(model.path), model.name, enable_auto_tool_choice, tool_call_parser,
                                     max_logprobs, max_choices),
                                    _prepare_in_worker)

    def close(self) -> None:
        self._workers.close()

    async def chat(self, body: bytes, pin: bytes | None, *, render: bool = False) -> EngineRequest:
        """A /v1/chat/completions body; `pin`: the X-Data-Parallel-Rank header, if sent. `render`: for
        /v1/chat/completions/render, which sends nothing to the engines and parses no output: the
        request before the checks on what the ready engines can give and before the parsers' options
        (the token-in route makes the engine checks when the rendered request comes back)."""
        prepared = await self._prepared("chat", body)
        req = prepared.req
        assert isinstance(req, ChatCompletionRequest)
        choice, schema = prepared.tool_choice, prepared.json_schema
        forced = Constraint("tool_choice", "json_schema", schema) if schema is not None else None
        if render:
            return self._engine_request(req, prepared.ids, pin, chat=True, constraint=forced or prepared.constraint,
                                        render=True, request_id=f"chatcmpl-{os.urandom(12).hex()}",
                                        lora=prepared.lora)
        if schema is not None:
            problem = self._engine_problem(FORCED_TOOLS_MINOR)
            if problem is not None:
                what = "'required'" if choice == "required" else "naming a function"
                raise APIError(400, f"tool_choice {what} needs guaranteed structured output, which {problem}",
                               param="tool_choice")
        request = self._engine_request(req, prepared.ids, pin, chat=True, request_id=f"chatcmpl-{os.urandom(12).hex()}",
                                       constraint=forced or prepared.constraint, lora=prepared.lora)
        if self._harmony and request.output.stop and schema is None:
            raise APIError(400, "stop strings are not supported with gpt-oss's harmony output (the openai "
                           "parsers read it by token, not as text); use stop_token_ids", param="stop")
        tool_parser = self._tool_call_parser if choice == "auto" and prepared.tools else None
        keep = self._reasoning_tags_special or (tool_parser is not None and self._tool_tags_special)
        skip = request.output.skip_special_tokens and not keep
        reasoning_parser = (self._reasoning_parser or "openai") if self._harmony else self._reasoning_parser
        output = replace(request.output, tools=prepared.tools, tool_choice=choice,
                         parallel_tool_calls=prepared.parallel_tool_calls, skip_special_tokens=skip,
                         tool_parser=tool_parser, reasoning_parser=reasoning_parser,
                         prompt_tail=prepared.prompt_tail)
        return replace(request, output=output)

    async def completion(self, body: bytes, pin: bytes | None, *, render: bool = False) -> list[EngineRequest]:
        """A /v1/completions body, one request per prompt (a batch has several; vLLM's choice indexes
        run over them: prompt i's choice j is i * n + j); `pin`: the X-Data-Parallel-Rank header, if
        sent; `render`: for /v1/completions/render."""
        prepared = await self._prepared("completion", body)
        req = prepared.req
        assert isinstance(req, CompletionRequest) and prepared.prompts is not None
        request_id = f"cmpl-{os.urandom(12).hex()}"
        if len(prepared.prompts) == 1:
            ids, echo = prepared.prompts[0]
            return [self._engine_request(req, ids, pin, chat=False, request_id=request_id,
                                         constraint=prepared.constraint, echo=echo, render=render,
                                         lora=prepared.lora)]
        requests = [self._engine_request(req, ids, pin, chat=False, request_id=f"{request_id}-{i}",
                                         constraint=prepared.constraint, echo=echo, render=render,
                                         lora=prepared.lora)
                    for i, (ids, echo) in enumerate(prepared.prompts)]
        if req.request_id is None:  # the response is named for the whole batch
            requests = [replace(r, output=replace(r.output, response_id=request_id)) for r in requests]
        return requests

    async def generate(self, body: bytes, pin: bytes | None, *, kind: str = "generate") -> EngineRequest:
        """An /inference/v1/generate body: token ids and vLLM's sampling parameters, answered in token ids.
        `kind` "grpc" or "grpc_stream": `body` is a serialized gRPC GenerateRequest instead (its pin and
        LoRA adapter come with it)."""
        prepared = await self._prepared(kind, body)
        req = prepared.req
        assert isinstance(req, token_in.TokenInRequest)
        sp = req.sampling_params
        constraint = token_in.constraint(sp)
        # A JSON Schema reaches engines of protocol 1.2 on; the other kinds and the logits controls 1.3.
        needs = [(constraint.param, "guaranteed structured output",
                  FORCED_TOOLS_MINOR if constraint.kind == "json_schema" else SAMPLING_CONTROLS_MINOR)
                 ] if constraint is not None else []
        needs += [(name, "the engine to apply it to the logits", SAMPLING_CONTROLS_MINOR)
                  for name in token_in.logits_controls(sp)]
        for param, what, minor in needs:
            problem = self._engine_problem(minor)
            if problem is not None:
                raise APIError(400, f"{param}: needs {what}, which {problem}", param=param)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(sp, name) is not None:
                problem = self._engine_problem(LOGPROBS_MINOR, backend=None)
                if problem is not None:
                    param = f"{token_in.PREFIX}.{name}"
                    raise APIError(400, f"{param}: logprobs need engines that send them, which {problem}", param=param)
        requested = None if sp.max_tokens is msgspec.UNSET else sp.max_tokens
        max_tokens = self._max_tokens(len(prepared.ids), requested, chat=True, render=False, param="token_ids",
                                      max_tokens_param=f"{token_in.PREFIX}.max_tokens")
        usage = req.stream_options is not None and req.stream_options.include_usage
        continuous = usage and req.stream_options is not None and req.stream_options.continuous_usage_stats
        caller_id = req.request_id or f"generate-{os.urandom(12).hex()}"
        # The caller's id may be any string, and two callers may send the same one: the engine's is ours.
        request_id = f"generate-tokens-{os.urandom(12).hex()}"
        output = OutputOptions(chat=False, stream=bool(req.stream), include_usage=usage, continuous_usage=continuous,
                               stop=tuple(token_in.stops_of(sp)), skip_special_tokens=sp.skip_special_tokens,
                               include_stop_str_in_output=sp.include_stop_str_in_output, token_out=True,
                               text_out=req.return_text, response_id=caller_id,
                               constraint_param=constraint.param if constraint is not None else None,
                               param_prefix=f"{token_in.PREFIX}.", logprobs=sp.logprobs,
                               prompt_logprobs=sp.prompt_logprobs,
                               stream_interval=max(sp.stream_interval or 1, self._stream_interval))
        vocab = self._model.tokenizer.get_vocab_size(with_added_tokens=True)
        sampling = token_in.engine_sampling(sp, max_tokens, vocab)
        rank = prepared.pin if prepared.pin is not None else _pinned_rank(pin)
        request = GenerateRequest(request_id, prepared.ids.tolist(), sampling, time.time(), req.priority, prepared.lora,
                                  req.cache_salt, rank)
        return EngineRequest(request, max_tokens, output)

    async def tokenize(self, body: bytes) -> Tokenized:
        """A /tokenize body (the completion form, or the chat form rendered as the chat route renders it)."""
        result = await self._prepare("tokenize", body)
        assert isinstance(result, Tokenized)
        if result.adapter is not None:  # a LoRA adapter tokenizes as its base model, once it is served
            await self._check_adapter(result.adapter, "model")
        return result

    async def detokenize(self, body: bytes) -> bytes:
        """A /detokenize body; the answer's JSON."""
        answer, adapter = await self._prepare("detokenize", body)
        if adapter is not None:
            await self._check_adapter(adapter, "model")
        assert isinstance(answer, bytes)
        return answer

    async def _prepared(self, kind: str, body: bytes) -> Prepared:
        """A generation body prepared, the LoRA adapter it names (as its model) served."""
        prepared: Prepared = await self._prepare(kind, body)
        if prepared.lora is not None:
            await self._check_adapter(prepared.lora, "lora_name" if kind.startswith("grpc") else "model")
        return prepared

    async def _prepare(self, kind: str, body: bytes) -> Any:
        if len(body) <= self._long_prompt_chars:
            return _PREPARE[kind](self._preparer, body)
        return await self._workers.prepare(kind, body)

    def _max_tokens(self, prompt_len: int, requested: int | None, *, chat: bool, render: bool, param: str,
                    max_tokens_param: str = "max_tokens") -> int:
        """The request's max_tokens, its default, held to the context length."""
        max_len = self._render_max_model_len() if render else self._max_model_len()
        if prompt_len >= max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens, but the prompt "
                           f"has {prompt_len} tokens", param=param)
        # As OpenAI and vLLM: chat may use the rest of the context, a text completion defaults to 16.
        default = max_len - prompt_len if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, max_len - prompt_len)
        max_tokens = requested if requested is not None else default
        if prompt_len + max_tokens > max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you "
                           f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                           f"{max_tokens} for the completion)", param=max_tokens_param)
        return max_tokens

    def _engine_request(self, req: ChatCompletionRequest | CompletionRequest, token_ids: array[int],
                        pin: bytes | None, *, chat: bool, request_id: str, constraint: Constraint | None = None,
                        echo: str | None = None, render: bool = False, lora: str | None = None) -> EngineRequest:
        logprobs, prompt_logprobs = _logprobs(req, echo)
        if not render:  # render asks no engine: the token-in route checks when the tokens come back
            self._check_engines(req, constraint, logprobs is not None or prompt_logprobs is not None)
        max_len = self._render_max_model_len() if render else self._max_model_len()
        truncated = _truncated(token_ids, req.truncate_prompt_tokens, req.truncation_side, max_len)
        if echo is not None and len(truncated) < len(token_ids):
            # The prompt the model saw, so that the echoed text and the prompt's logprobs agree.
            echo = self._model.tokenizer.decode(truncated.tolist(), skip_special_tokens=False)
        token_ids = truncated
        max_tokens = self._max_tokens(len(token_ids), req.max_tokens, chat=chat, render=render,
                                      param="messages" if chat else "prompt")
        sampling = sampling_params(req, max_tokens, self._model.tokenizer.get_vocab_size(with_added_tokens=True))
        if constraint is not None:
            sampling = msgspec.structs.replace(sampling, **{constraint.kind: constraint.value})
        if logprobs is not None or prompt_logprobs is not None:
            sampling = msgspec.structs.replace(sampling, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        pinned = _pinned_rank(pin)
        usage = req.stream_options is not None and req.stream_options.include_usage
        continuous = usage and req.stream_options is not None and req.stream_options.continuous_usage_stats
        # The caller's request_id names the response as vLLM names it; the engine's id stays ours and unique.
        # Several choices are engine requests of their own (`<id>-<j>`): the response keeps `<id>`.
        response_id = request_id if req.n > 1 else ""
        if req.request_id is not None:
            response_id = ("chatcmpl-" if chat else "cmpl-") + req.request_id
        output = OutputOptions(chat=chat, stream=bool(req.stream), include_usage=usage, continuous_usage=continuous,
                               stop=tuple(stop_list(req)), include_stop_str_in_output=req.include_stop_str_in_output,
                               skip_special_tokens=req.skip_special_tokens, response_id=response_id,
                               constraint_param=constraint.param if constraint is not None else None,
                               logprobs=logprobs, prompt_logprobs=prompt_logprobs, echo=echo,
                               return_tokens_as_token_ids=bool(req.return_tokens_as_token_ids),
                               stream_interval=max(req.stream_interval or 1, self._stream_interval))
        request = GenerateRequest(request_id, token_ids.tolist(), sampling, time.time(), req.priority, lora,
                                  req.cache_salt, pinned)
        return EngineRequest(request, max_tokens, output, req.n)

    def _check_engines(self, req: ChatCompletionRequest | CompletionRequest, constraint: Constraint | None,
                       logprobs: bool) -> None:
        """A 400 naming the first field that needs engines the ready ones are not (sim engines, say, or
        engines too old to send logprobs)."""
        fields = [] if constraint is None or constraint.param == "tool_choice" else [constraint.param]
        fields += logits_controls(req)
        if fields:
            problem = self._engine_problem(SAMPLING_CONTROLS_MINOR)
            if problem is not None:
                what = "guaranteed structured output" if constraint is not None and fields[0] == constraint.param \
                    else "the engine to apply it to the logits"
                raise APIError(400, f"{fields[0]}: needs {what}, which {problem}", param=fields[0])
        if logprobs:
            problem = self._engine_problem(LOGPROBS_MINOR, backend=None)
            if problem is not None:
                chat = isinstance(req, ChatCompletionRequest)
                field = "prompt_logprobs" if req.prompt_logprobs is not None else "top_logprobs" if chat else "logprobs"
                raise APIError(400, f"{field}: logprobs need engines that send them, which {problem}", param=field)


def _logprobs(req: ChatCompletionRequest | CompletionRequest, echo: str | None) -> tuple[int | None, int | None]:
    """The engine's logprobs and prompt_logprobs, as vLLM sets them: chat's logprobs are top_logprobs (0
    when absent) once logprobs is true; an echoed completion's prompt_logprobs default to its logprobs."""
    if isinstance(req, ChatCompletionRequest):
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        logprobs = req.logprobs
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and echo is not None:
        prompt_logprobs = logprobs
    return logprobs, prompt_logprobs

def _template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
    return template_kwargs(req.chat_template_kwargs, documents=req.documents, reasoning_effort=req.reasoning_effort)


def _truncated(ids: array[int], keep: int | None, side: str | None, max_model_len: int) -> array[int]:
    try:
        return truncated(ids, keep, side, max_model_len)
    except PromptError as exc:
        raise APIError(400, str(exc), param=exc.param) from None


_CONSTRAINTS = frozenset({"json_schema", "regex", "choice", "grammar", "json_object", "structural_tag"})


def refused_field(error: str, options: OutputOptions) -> tuple[str, str | None]:
    """An engine's refusal of its request ("sampling.grammar: ...") told as the request field it is
    about ("structured_outputs.grammar: ..."), with that field; other messages as they came."""
    head, sep, rest = error.partition(": ")
    name = head.removeprefix("sampling.")
    if not sep or name == head or not name.isidentifier():
        return error, None
    param = options.constraint_param if name in _CONSTRAINTS else options.param_prefix + name
    if param is None:
        return error, None
    return f"{param}: {rest}", param


def _pinned_rank(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        got = value.decode(errors="replace")
        raise APIError(400, f"{PIN_HEADER}: must be an integer rank, got {got!r}", param=PIN_HEADER) from None


# ---- in a worker process (workers.PreparePool) ----

_worker: Preparer | None = None


def _start_worker(path: str, name: str, enable_auto_tool_choice: bool, tool_call_parser: str | None,
                  max_logprobs: int, max_choices: int) -> None:
    global _worker
    _worker = Preparer(Model.load(path, name), enable_auto_tool_choice=enable_auto_tool_choice,
                       tool_call_parser=tool_call_parser, max_logprobs=max_logprobs, max_choices=max_choices)


# What each kind of body is prepared with, on the loop or in a worker.
_PREPARE: dict[str, Callable[[Preparer, bytes], Any]] = {
    "chat": Preparer.chat, "completion": Preparer.completion, "generate": Preparer.generate,
    "grpc": lambda p, raw: p.generate_grpc(raw, False), "grpc_stream": lambda p, raw: p.generate_grpc(raw, True),
    "tokenize": Preparer.tokenize, "detokenize": Preparer.detokenize}


def _prepare_in_worker(kind: str, body: bytes) -> Prepared | Tokenized | bytes:
    assert _worker is not None, "the worker's initializer has run"
    result: Prepared | Tokenized | bytes = _PREPARE[kind](_worker, body)
    return result


async def _no_adapters(name: str, param: str) -> None:
    """A Translator with no engines to ask (render-only, tests): only the base model is served."""
    raise no_such_model(name)
