"""Request translation: an OpenAI body (or a token-in one), prepared (preparer.py: checked, rendered and
tokenized, in a worker process when long), then checked against what the engines can give and turned
into ready engine requests (engine_request.py). Runs on each API server's event loop; /tokenize and
/detokenize pass through it for its worker processes."""
from __future__ import annotations

import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from prompting.errors import PromptError
from prompting.truncation import truncated as truncate_prompt
from protocol import GenerateRequest
from services.frontend.engine_client.lora import no_such_model
from services.frontend.errors import APIError, refused_prompt
from services.frontend.model import Model
from services.frontend.parsers import (
    HARMONY_REASONING_PARSERS,
    HARMONY_TOOL_PARSERS,
    REASONING_MARKERS,
    TOOL_MARKERS,
    keeps_special_tokens,
)
from services.frontend.requests import token_in
from services.frontend.requests.engine_request import EngineRequest, OutputOptions
from services.frontend.requests.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    logits_controls,
    sampling_params,
    stop_list,
)
from services.frontend.requests.preparer import (
    DEFAULT_MAX_CHOICES,
    PREPARE,
    Prepared,
    Preparer,
    prepare_in_worker,
    start_worker,
)
from services.frontend.requests.request_ids import random_hex
from services.frontend.requests.structured import Constraint
from services.frontend.requests.tokenization import Tokenized
from services.frontend.requests.workers import PreparePool

COMPLETION_DEFAULT_MAX_TOKENS = 16
PIN_HEADER = "X-Data-Parallel-Rank"
# Protocol minors that carry what the sim backend cannot honour: a forced tool_choice's JSON schema
# (1.2), the other structured-output constraints and the logits controls (1.3).
FORCED_TOOLS_MINOR, SAMPLING_CONTROLS_MINOR = 2, 3
LOGPROBS_MINOR = 3  # logprobs as packed arrays, and prompt_logprobs: every backend sends them from 1.3
_STRUCTURED, _LOGITS = "guaranteed structured output", "the engine to apply it to the logits"  # what a field needs


class EngineProblem(Protocol):
    """Why some ready engine cannot give what protocol 1.<minor> carries (an older one would drop the
    fields unread) or, unless `backend` is None, is not of that backend (only the vllm backend honours
    structured outputs and the logits controls); None when every ready engine can."""

    def __call__(self, minor: int, *, backend: str | None = "vllm") -> str | None: ...


def no_engine_problem(minor: int, *, backend: str | None = "vllm") -> str | None:
    return None


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
        self._workers = PreparePool(max_concurrent_tokenizations, start_worker,
                                    (str(model.path), model.name, enable_auto_tool_choice, tool_call_parser,
                                     max_logprobs, max_choices),
                                    prepare_in_worker)

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
                                        render=True, request_id=f"chatcmpl-{random_hex(12)}",
                                        lora=prepared.lora)
        if schema is not None:
            problem = self._engine_problem(FORCED_TOOLS_MINOR)
            if problem is not None:
                what = "'required'" if choice == "required" else "naming a function"
                raise APIError(400, f"tool_choice {what} needs guaranteed structured output, which {problem}",
                               param="tool_choice")
        tool_parser = self._tool_call_parser if choice == "auto" and prepared.tools else None
        keep = self._reasoning_tags_special or (tool_parser is not None and self._tool_tags_special)
        reasoning_parser = (self._reasoning_parser or "openai") if self._harmony else self._reasoning_parser
        # The chat fields of its OutputOptions made with it, not replaced after (two dataclass replaces of a
        # frozen 22-field class: ~10 us a request).
        request = self._engine_request(req, prepared.ids, pin, chat=True, request_id=f"chatcmpl-{random_hex(12)}",
                                       constraint=forced or prepared.constraint, lora=prepared.lora,
                                       chat_output={"tools": prepared.tools, "tool_choice": choice,
                                                    "parallel_tool_calls": prepared.parallel_tool_calls,
                                                    "skip_special_tokens": req.skip_special_tokens and not keep,
                                                    "tool_parser": tool_parser, "reasoning_parser": reasoning_parser,
                                                    "prompt_tail": prepared.prompt_tail})
        if self._harmony and request.output.stop and schema is None:
            raise APIError(400, "stop strings are not supported with gpt-oss's harmony output (the openai "
                           "parsers read it by token, not as text); use stop_token_ids", param="stop")
        return request

    async def completion(self, body: bytes, pin: bytes | None, *, render: bool = False) -> list[EngineRequest]:
        """A /v1/completions body, one request per prompt (a batch has several; vLLM's choice indexes
        run over them: prompt i's choice j is i * n + j); `pin`: the X-Data-Parallel-Rank header, if
        sent; `render`: for /v1/completions/render."""
        prepared = await self._prepared("completion", body)
        req = prepared.req
        assert isinstance(req, CompletionRequest) and prepared.prompts is not None
        request_id = f"cmpl-{random_hex(12)}"
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
            requests = [msgspec.structs.replace(r, output=msgspec.structs.replace(r.output, response_id=request_id))
                        for r in requests]
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
        needs = [(constraint.param, _STRUCTURED,
                  FORCED_TOOLS_MINOR if constraint.kind == "json_schema" else SAMPLING_CONTROLS_MINOR)
                 ] if constraint is not None else []
        needs += [(name, _LOGITS, SAMPLING_CONTROLS_MINOR) for name in token_in.logits_controls(sp)]
        logprobs_field = next((f"{token_in.PREFIX}.{name}" for name in ("logprobs", "prompt_logprobs")
                               if getattr(sp, name) is not None), None)
        self._check_engines(needs, logprobs_field)
        requested = None if sp.max_tokens is msgspec.UNSET else sp.max_tokens
        max_tokens = self._max_tokens(len(prepared.ids), requested, chat=True, max_len=self._max_model_len(),
                                      param="token_ids", max_tokens_param=f"{token_in.PREFIX}.max_tokens")
        caller_id = req.request_id or f"generate-{random_hex(12)}"
        # The caller's id may be any string, and two callers may send the same one: the engine's is ours.
        request_id = f"generate-tokens-{random_hex(12)}"
        output = self._output_options(req.stream, req.stream_options, constraint, sp.stream_interval, chat=False,
                                      stop=tuple(token_in.stops_of(sp)), skip_special_tokens=sp.skip_special_tokens,
                                      include_stop_str_in_output=sp.include_stop_str_in_output, token_out=True,
                                      text_out=req.return_text, response_id=caller_id,
                                      param_prefix=f"{token_in.PREFIX}.", logprobs=sp.logprobs,
                                      prompt_logprobs=sp.prompt_logprobs)
        vocab = self._model.vocab_size
        sampling = token_in.engine_sampling(sp, max_tokens, vocab)
        rank = prepared.pin if prepared.pin is not None else pinned_rank(pin)
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
            return PREPARE[kind](self._preparer, body)
        return await self._workers.prepare(kind, body)

    def _max_tokens(self, prompt_len: int, requested: int | None, *, chat: bool, max_len: int, param: str,
                    max_tokens_param: str = "max_tokens") -> int:
        """The request's max_tokens, its default, held to the context length `max_len`."""
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
                        echo: str | None = None, render: bool = False, lora: str | None = None,
                        chat_output: dict[str, Any] | None = None) -> EngineRequest:
        """`chat_output`: a chat request's OutputOptions fields (its tools, parsers, skip_special_tokens)."""
        logprobs, prompt_logprobs = _logprobs(req, echo)
        if not render:  # render asks no engine: the token-in route checks when the tokens come back
            self._check_fields(req, constraint, logprobs is not None or prompt_logprobs is not None)
        max_len = self._render_max_model_len() if render else self._max_model_len()
        truncated = _truncated(token_ids, req.truncate_prompt_tokens, req.truncation_side, max_len)
        if echo is not None and len(truncated) < len(token_ids):
            # The prompt the model saw, so that the echoed text and the prompt's logprobs agree.
            echo = self._model.tokenizer.decode(truncated.tolist(), skip_special_tokens=False)
        token_ids = truncated
        max_tokens = self._max_tokens(len(token_ids), req.max_tokens, chat=chat, max_len=max_len,
                                      param="messages" if chat else "prompt")
        sampling = sampling_params(req, max_tokens, self._model.vocab_size)
        if constraint is not None:
            sampling = msgspec.structs.replace(sampling, **{constraint.kind: constraint.value})
        if logprobs is not None or prompt_logprobs is not None:
            sampling = msgspec.structs.replace(sampling, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        pinned = pinned_rank(pin)
        # The caller's request_id names the response as vLLM names it; the engine's id stays ours and unique.
        # Several choices are engine requests of their own (`<id>-<j>`): the response keeps `<id>`.
        response_id = request_id if req.n > 1 else ""
        if req.request_id is not None:
            response_id = ("chatcmpl-" if chat else "cmpl-") + req.request_id
        fields = {"skip_special_tokens": req.skip_special_tokens}
        if chat_output is not None:
            fields = chat_output
        output = self._output_options(req.stream, req.stream_options, constraint, req.stream_interval, chat=chat,
                                      stop=tuple(stop_list(req)),
                                      include_stop_str_in_output=req.include_stop_str_in_output,
                                      response_id=response_id, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                      echo=echo, return_tokens_as_token_ids=bool(req.return_tokens_as_token_ids),
                                      **fields)
        request = GenerateRequest(request_id, token_ids.tolist(), sampling, time.time(), req.priority, lora,
                                  req.cache_salt, pinned)
        return EngineRequest(request, max_tokens, output, req.n)

    def _output_options(self, stream: bool | None, stream_options: Any, constraint: Constraint | None,
                        stream_interval: int | None, **fields: Any) -> OutputOptions:
        """A request's OutputOptions: what every route sets alike (streaming, the usage flags, the field a
        constraint came from, the stream interval: the server's, or the request's if larger), then `fields`."""
        usage = stream_options is not None and stream_options.include_usage
        continuous = usage and stream_options.continuous_usage_stats
        return OutputOptions(stream=bool(stream), include_usage=usage, continuous_usage=continuous,
                             constraint_param=constraint.param if constraint is not None else None,
                             stream_interval=max(stream_interval or 1, self._stream_interval), **fields)

    def _check_fields(self, req: ChatCompletionRequest | CompletionRequest, constraint: Constraint | None,
                      logprobs: bool) -> None:
        """A chat or completions request's fields that need more of the engines than some may give (a
        forced tool_choice is checked before: its message is its own)."""
        fields = [] if constraint is None or constraint.param == "tool_choice" else [constraint.param]
        fields += logits_controls(req)
        needs = [(name, _STRUCTURED if constraint is not None and name == constraint.param else _LOGITS,
                  SAMPLING_CONTROLS_MINOR) for name in fields]
        logprobs_field = None
        if logprobs:
            chat = isinstance(req, ChatCompletionRequest)
            logprobs_field = "prompt_logprobs" if req.prompt_logprobs is not None else \
                "top_logprobs" if chat else "logprobs"
        self._check_engines(needs, logprobs_field)

    def _check_engines(self, needs: list[tuple[str, str, int]], logprobs_field: str | None) -> None:
        """A 400 naming the first field that needs engines the ready ones are not (sim engines, say, or
        engines too old to send logprobs). `needs`: (field, what it needs, the protocol minor that carries
        it); `logprobs_field`: the field that asked for logprobs, if one did."""
        for param, what, minor in needs:
            problem = self._engine_problem(minor)
            if problem is not None:
                raise APIError(400, f"{param}: needs {what}, which {problem}", param=param)
        if logprobs_field is not None:
            problem = self._engine_problem(LOGPROBS_MINOR, backend=None)
            if problem is not None:
                raise APIError(400, f"{logprobs_field}: logprobs need engines that send them, which {problem}",
                               param=logprobs_field)


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


def pinned_rank(value: bytes | None) -> int | None:
    """The X-Data-Parallel-Rank header's rank, if sent."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        got = value.decode(errors="replace")
        raise APIError(400, f"{PIN_HEADER}: must be an integer rank, got {got!r}", param=PIN_HEADER) from None


async def _no_adapters(name: str, param: str) -> None:
    """A Translator with no engines to ask (render-only, tests): only the base model is served."""
    raise no_such_model(name)


def _truncated(ids: array[int], keep: int | None, side: str | None, max_model_len: int) -> array[int]:
    try:
        return truncate_prompt(ids, keep, side, max_model_len)
    except PromptError as exc:
        raise refused_prompt(exc) from None
