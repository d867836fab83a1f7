"""The generation core that the HTTP and gRPC faces share, one per API server process: the engines, the
translator, placement and submission, the LoRA registry, shutdown and metrics, and the launch of a
response's engine requests with their output processing. Runs on the API server's event loop."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import metadata

import tracing
from prompting.model_files import model_config
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.engine_client.inflight import InFlight, Wakeup
from services.frontend.engine_client.lora import Adapters
from services.frontend.engine_client.placement import NoEngine, Placement
from services.frontend.errors import APIError
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.output import OutputProcessor
from services.frontend.generation.pooling import PoolingRunner
from services.frontend.generation.request_trace import RequestTrace
from services.frontend.generation.shutdown import Shutdown
from services.frontend.generation.submitter import Submitter
from services.frontend.model import Model
from services.frontend.parsers import OutputParser, TokenOutputParser, build_parser
from services.frontend.parsers.forced import NamedToolParser, RequiredToolParser
from services.frontend.requests.engine_request import EngineRequest, OutputOptions
from services.frontend.requests.pooling_model import PoolingModel
from services.frontend.requests.translator import PIN_HEADER, Translator

_GENERATE = ("generate",)


class FrontendCore:
    """One per API server process; the HTTP app (http_api/app.py) and the gRPC services (grpc_api/) each
    take it, never each other."""

    def __init__(self, config: FrontendConfig, model: Model, engines: EngineSet, metrics: Metrics) -> None:
        self.config = config
        self.model = model
        self.engines = engines
        self.metrics = metrics
        self.placement = Placement()
        self.submitter = Submitter(engines, self.placement)
        self.lora = Adapters(engines, model.name)
        self.shutdown = Shutdown()
        # What /classify, /score and /rerank read of the model beyond its engines (labels, token types).
        self.pooling_model = PoolingModel.of(model.name, model.tokenizer, model_config(model.path))
        self.pooling = PoolingRunner(engines, self.placement, metrics, self.shutdown, self.pooling_model.num_labels)
        self.version = fleet_version()
        self.translator = Translator(model, self.max_model_len, long_prompt_chars=config.long_prompt_chars,
                                     max_concurrent_tokenizations=config.max_concurrent_tokenizations,
                                     enable_auto_tool_choice=config.enable_auto_tool_choice,
                                     tool_call_parser=config.tool_call_parser, reasoning_parser=config.reasoning_parser,
                                     engine_problem=self.engine_problem, max_logprobs=config.max_logprobs,
                                     render_max_model_len=self.context_len,
                                     max_choices=config.max_request_choices,
                                     stream_interval=config.stream_interval,
                                     # render-only: no engines, so no adapters (a name not the model's is a 404)
                                     check_adapter=None if config.render_only else self.lora.check)

    def close(self) -> None:
        self.translator.close()

    @contextlib.contextmanager
    def launch(self, requests: list[EngineRequest]) -> Iterator[tuple[list[list[OutputProcessor]], list[InFlight],
                                                                      Wakeup | None]]:
        """Place and submit a response's engine requests; inside, their output processors (per prompt, per
        choice), in-flight requests and shared wake-up; on leaving, every one still at its engine is aborted.
        HTTP's writers and gRPC's run inside it. `requests`: one per prompt (a completions batch
        has several), each with its n choices; every choice is an engine request of its own, and a prompt's
        choices go to one engine, whose prefix cache the later ones hit (the engine caches a prompt's blocks
        as it schedules them, as vLLM's does). Raises APIError when no engine can take them."""
        if self.shutdown.cut is not None:  # its body or tokens arrived after the shutdown deadline
            raise APIError(503, self.shutdown.cut)
        self.refuse_task(_GENERATE, "Generate")  # gRPC's way in; HTTP routes refuse before translation
        try:
            engines = [self.submitter.choose(request) for request in requests]
        except NoEngine as exc:
            raise APIError(exc.status, str(exc), param=PIN_HEADER if exc.status == 400 else None) from None
        several = len(requests) > 1 or requests[0].n > 1
        wakeup = Wakeup() if several else None
        prompts: list[list[OutputProcessor]] = []
        streams: list[InFlight] = []
        traces: list[RequestTrace] = []
        traced = tracing.enabled()
        try:
            for request, engine in zip(requests, engines, strict=True):
                parent = self.metrics.parent(request.n) if request.n > 1 else None
                choices = []
                for choice in request.choices():
                    trace = RequestTrace.start(choice) if traced else None
                    if trace is not None:  # its span's context goes to the engine with the request
                        choice = trace.carried(choice)
                        trace.placed(engine.rank)
                        traces.append(trace)
                    stream = InFlight(choice.request_id, choice.prompt_len, choice.max_tokens)
                    stream.group = wakeup
                    if choice.output.stream:
                        stream.interval = choice.output.stream_interval
                    choices.append(OutputProcessor(stream, choice, tokenizer=self.model.tokenizer,
                                                   engines=self.submitter, metrics=self.metrics,
                                                   parser=output_parser(choice.output), parent=parent,
                                                   trace=trace))
                    self.submitter.submit(engine, stream, choice)
                    self.metrics.running.inc()
                    self.metrics.prompt_tokens.inc(choice.prompt_len)
                    streams.append(stream)
                prompts.append(choices)
            with self.shutdown.running(*streams):
                yield prompts, streams, wakeup
        finally:
            for stream in streams:
                self.submitter.abort(stream)  # a no-op unless it is still running at its engine
                self.metrics.running.dec()
            for trace in traces:
                trace.close()

    def refuse_task(self, tasks: tuple[str, ...], api: str) -> None:
        """A 400 when the route's `tasks` do not fit the model: a generation route on a pooling model, or a
        pooling route whose task is not the model's own pooling task (vLLM serves /v1/embeddings only for
        an embedding model, /classify only for a classifier: pooling_model.PoolingModel.pooling_task),
        in vLLM's words for the API, with what the model does. Nothing is known before a handshake: the
        route's placement answers 503 then."""
        if tasks == _GENERATE:
            # Every generation request asks this (twice over HTTP): answered without building the task list
            # when some handshaken rank generates, or none has handshaken.
            handshaken = False
            for engine in self.engines.engines:
                if engine.ready is not None:
                    if "generate" in engine.tasks:
                        return
                    handshaken = True
            if not handshaken:
                return
        served = self.engines.tasks()
        if served is None:
            return
        if tasks == ("generate",):
            if "generate" in served:
                return
            raise APIError(400, f"The model does not support {api} API: it serves the tasks {served}, not "
                                "'generate'")
        own = self.pooling_model.pooling_task(served)
        if own in tasks:
            return
        does = f"its pooling task is {own!r}" if own is not None else f"it serves the tasks {served}"
        wanted = tasks[0] if len(tasks) == 1 else list(tasks)
        raise APIError(400, f"The model does not support {api} API: {does}, not {wanted!r}")

    def engine_problem(self, minor: int, *, backend: str | None = "vllm") -> str | None:
        """Why some ready engine is older than protocol 1.<minor> (it would drop the fields unread) or,
        unless `backend` is None, not of that backend (only the vllm backend honours structured output
        and the logits controls; every backend sends logprobs), or None (translator.EngineProblem)."""
        for engine in self.engines.engines:
            ready = engine.ready
            if ready is None:
                continue
            old = (ready.major, ready.minor) < (1, minor)
            if backend is not None and (old or ready.backend != backend):
                return (f"engine rank {engine.rank} cannot (its {ready.backend} backend, protocol "
                        f"{ready.major}.{ready.minor}; the {backend} backend with protocol 1.{minor} or newer can)")
            if old:
                return (f"engine rank {engine.rank} does not (protocol {ready.major}.{ready.minor}; "
                        f"1.{minor} or newer does)")
        return None

    def max_model_len(self, *, or_zero: bool = False) -> int:
        """The engines' context length (503 while none has handshaken, or 0 with `or_zero`)."""
        if self.config.render_only:
            return self.context_len()
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if not lens:
            if or_zero:
                return 0
            raise APIError(503, "no engine has handshaken yet: " + str(self.engines.not_ready()))
        return min(lens)

    def context_len(self) -> int:
        """The context length for the routes that need no engine (render, tokenize): the engines' once one
        has handshaken, else --max-model-len or the model config's (render-only mode has no engine to ask)."""
        lens = [e.max_model_len for e in self.engines.engines if e.ready is not None]
        if lens:
            return min(lens)
        configured = self.config.max_model_len or self.model.config_max_model_len
        if configured is None:  # render-only refuses to start so (server.py); a frontend waits for its engines
            raise APIError(503, "no engine has handshaken yet and the model's config.json gives no context length")
        return configured


def output_parser(options: OutputOptions) -> OutputParser | TokenOutputParser | None:
    """The request's output parser: reasoning and tool calls, or a forced tool_choice's."""
    # A forced tool_choice's output is structured from its first token: no reasoning to split off.
    if isinstance(options.tool_choice, dict):
        return NamedToolParser(options.tool_choice["function"]["name"])
    if options.tool_choice == "required":
        return RequiredToolParser()
    if options.tool_parser is not None or options.reasoning_parser is not None:
        return build_parser(options.tool_parser, options.reasoning_parser, tools=list(options.tools),
                            prompt=options.prompt_tail)
    return None


def fleet_version() -> str:
    """This fleet's package version, as HTTP's /version and gRPC's GetServerInfo report it."""
    try:
        return metadata.version("fleet")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
