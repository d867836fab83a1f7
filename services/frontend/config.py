"""Frontend configuration: one frozen dataclass built from the command line (`frontend --help`)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields

import tracing
from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, MIN_BODY_RATE
from protocol.handshake import auth_token_from
from services.frontend.parsers import (
    HARMONY_REASONING_PARSERS,
    HARMONY_TOOL_PARSERS,
    REASONING_PARSER_NAMES,
    TOOL_PARSER_NAMES,
)


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    model: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str | None = None  # the public model id; default: --model
    data_parallel_size: int = 1  # engines that must be Ready before /ready says 200
    data_parallel_size_local: int = 1  # engines this process starts itself (0: connect only)
    engine_addresses: tuple[str, ...] = ()  # tcp://host:port of each engine rank, in rank order
    backend: str = "vllm"  # for engines started here (managed mode)
    engine_port: int = 5555  # first port for engines started here
    engine_args: tuple[str, ...] = ()  # extra flags passed to engines started here
    auth_token: str | None = field(default=None, repr=False)  # engine handshake token; kept out of logs
    handshake_timeout_s: float = 600.0  # how long start-up waits for all engines before it gives up
    engine_timeout_s: float = 2.0  # an engine silent this long is slow: it takes no new requests
    engine_dead_timeout_s: float | None = None  # ... and this long dead (default 5x): its running requests fail
    heartbeat_interval_s: float = 0.5
    shutdown_timeout_s: float = 30.0  # on SIGTERM, how long running requests may finish (the engines' drain)
    max_body_bytes: int = 4 * 2**20
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S  # headers within it, body gaps under it; or 408 and closed
    # Per API server process; one more is answered 503 and closed. None: DEFAULT_MAX_CONNECTIONS, or for
    # granian, which cannot bound its connections, no limit.
    max_connections: int | None = None
    max_concurrent_tokenizations: int = 2
    long_prompt_chars: int = 2000  # longer bodies are prepared in worker processes (workers.py)
    api_server_count: int = 1
    http_server: str = "uvicorn"  # the ASGI server: uvicorn (httptools) or hypercorn (h11); docs/frontend.md
    log_level: str = "info"
    enable_auto_tool_choice: bool = False  # tool_choice "auto" is served (needs tool_call_parser)
    tool_call_parser: str | None = None  # a name in services/frontend/parsers TOOL_PARSER_NAMES
    reasoning_parser: str | None = None  # a name in REASONING_PARSER_NAMES
    render_only: bool = False  # tokenizer, template and config only: render and tokenize, no engine
    max_model_len: int | None = None  # render-only: the context length to check (default: the model config's)
    max_logprobs: int = 20  # most logprobs / top_logprobs / prompt_logprobs a request may ask for (vLLM's)
    max_request_choices: int = 256  # n times the prompts of one body: each is an engine request
    stream_interval: int = 1  # tokens per streamed chunk (vLLM's --stream-interval); a request may ask for more
    grpc_port: int = 0  # the gRPC services' port (grpc_api/); 0: not served
    api_keys: tuple[str, ...] = ()  # keys the generation routes and gRPC require; none: open
    # /v1/load_lora_adapter and /v1/unload_lora_adapter served (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)
    allow_runtime_lora_updating: bool = False
    frontend_id: str = field(default="")
    # OTLP traces to this collector (vLLM's --otlp-traces-endpoint); the OTEL_* environment also configures
    # it (tracing/settings.py). None and no OTEL_* endpoint: not traced. Engines started here get it too.
    otlp_traces_endpoint: str | None = None

    @property
    def connection_limit(self) -> int:
        """--max-connections, or its default (uvicorn and hypercorn)."""
        return DEFAULT_MAX_CONNECTIONS if self.max_connections is None else self.max_connections

    def __post_init__(self) -> None:
        if self.engine_dead_timeout_s is None:  # follows --engine-timeout: raising it alone stays valid
            object.__setattr__(self, "engine_dead_timeout_s", 5 * self.engine_timeout_s)
        _require(0 < self.port < 65536, "--port", self.port, "1..65535")
        _require(self.data_parallel_size >= 1, "--data-parallel-size", self.data_parallel_size, ">= 1")
        _require(self.data_parallel_size_local >= 0, "--data-parallel-size-local",
                 self.data_parallel_size_local, ">= 0")
        _require(self.engine_timeout_s > self.heartbeat_interval_s / 5, "--engine-timeout",
                 self.engine_timeout_s, "> 0.1 s (engines beat every 100 ms)")
        assert self.engine_dead_timeout_s is not None
        _require(self.engine_dead_timeout_s >= self.engine_timeout_s, "--engine-dead-timeout",
                 self.engine_dead_timeout_s, f">= --engine-timeout ({self.engine_timeout_s})")
        _require(self.max_body_bytes >= 1024, "--max-body-bytes", self.max_body_bytes, ">= 1024")
        _require(self.header_timeout_s > 0, "--header-timeout", self.header_timeout_s, "> 0 seconds")
        _require(self.max_connections is None or self.max_connections >= 1, "--max-connections",
                 self.max_connections, ">= 1")
        _require(self.max_connections is None or self.http_server != "granian", "--max-connections",
                 self.max_connections, "left out with --http-server granian (granian cannot bound its connections: "
                 "use uvicorn or hypercorn)")
        _require(self.shutdown_timeout_s >= 0, "--shutdown-timeout", self.shutdown_timeout_s, ">= 0 seconds")
        _require(1 <= self.api_server_count <= 64, "--api-server-count", self.api_server_count, "1..64")
        _require(self.backend in ("vllm", "sim"), "--backend", self.backend, "vllm or sim")
        _require(self.http_server in HTTP_SERVERS, "--http-server", self.http_server, " or ".join(HTTP_SERVERS))
        _require(self.http_server != "granian" or self.api_server_count == 1, "--http-server", self.http_server,
                 "uvicorn or hypercorn with --api-server-count above 1 (granian binds without SO_REUSEPORT)")
        _require(0 <= self.max_logprobs <= 1024, "--max-logprobs", self.max_logprobs, "0..1024")
        _require(self.max_request_choices >= 1, "--max-request-choices", self.max_request_choices, ">= 1")
        _require(self.stream_interval >= 1, "--stream-interval", self.stream_interval, ">= 1")
        _require(0 <= self.grpc_port <= 65535 and (self.grpc_port == 0 or self.grpc_port != self.port), "--grpc-port",
                 self.grpc_port, "0 (off) or a port other than --port")
        _require(not self.grpc_port or not self.render_only, "--grpc-port", self.grpc_port,
                 "0 with --render-only (gRPC serves generation, which needs engines)")
        _require(all(self.api_keys), "--api-key", "", "non-empty keys")
        _require(not self.enable_auto_tool_choice or self.tool_call_parser is not None,
                 "--enable-auto-tool-choice", True, "only with --tool-call-parser")
        _require(self.tool_call_parser in (None, *TOOL_PARSER_NAMES), "--tool-call-parser", self.tool_call_parser,
                 ", ".join(TOOL_PARSER_NAMES))
        _require(self.reasoning_parser in (None, *REASONING_PARSER_NAMES), "--reasoning-parser",
                 self.reasoning_parser, ", ".join(REASONING_PARSER_NAMES))
        harmony = (self.tool_call_parser in HARMONY_TOOL_PARSERS, self.reasoning_parser in HARMONY_REASONING_PARSERS)
        _require(self.tool_call_parser is None or self.reasoning_parser is None or harmony[0] == harmony[1],
                 "--reasoning-parser", self.reasoning_parser,
                 f"a parser of the same format as --tool-call-parser {self.tool_call_parser} (harmony's openai "
                 "parsers read gpt-oss output, which no other family writes)")
        if self.render_only:
            _require(not self.engine_addresses and self.data_parallel_size_local == 0, "--render-only", True,
                     "without --engine-addresses or --data-parallel-size-local: a render-only frontend connects "
                     "to no engine and starts none")
        else:
            _require(self.max_model_len is None, "--max-model-len", self.max_model_len,
                     "only with --render-only (with engines, the engines say it)")
        _require(self.max_model_len is None or self.max_model_len >= 2, "--max-model-len", self.max_model_len, ">= 2")
        if self.data_parallel_size_local == 0 and not self.render_only:
            _require(len(self.engine_addresses) == self.data_parallel_size, "--engine-addresses",
                     ",".join(self.engine_addresses),
                     f"exactly --data-parallel-size ({self.data_parallel_size}) tcp:// addresses")
        for address in self.engine_addresses:
            _require(address.startswith("tcp://") and address.rsplit(":", 1)[-1].isdigit(),
                     "--engine-addresses", address, "tcp://HOST:PORT")

    @property
    def harmony(self) -> bool:
        """The output is gpt-oss's harmony format (an openai parser is named)."""
        return self.tool_call_parser in HARMONY_TOOL_PARSERS or self.reasoning_parser in HARMONY_REASONING_PARSERS

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def _require(ok: bool, flag: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{flag}={value!r} is invalid: allowed {allowed}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" where there is a value to show; a flag without one says its default in words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None or action.default is False or action.default in ("", []):
            return action.help
        return super()._get_help_string(action)


HTTP_SERVERS = ("uvicorn", "hypercorn", "granian")  # granian: the `granian` extra (make installs it)


def build_parser() -> argparse.ArgumentParser:
    """`frontend --help`: defaults are FrontendConfig's, written once there."""
    d = {f.name: f.default for f in fields(FrontendConfig)}
    p = argparse.ArgumentParser(prog="frontend", formatter_class=_HelpFormatter, description="OpenAI-compatible "
                                "HTTP server over headless engines (engine protocol over ZMQ).",
                                allow_abbrev=False)  # a prefix (--mod) must not pass for a flag
    p.add_argument("--model", required=True, help="'tiny' (built on first use) or a local checkpoint directory")
    p.add_argument("--host", default=d["host"], help="address the HTTP server binds")
    p.add_argument("--port", type=int, default=d["port"], help="port the HTTP server listens on")
    p.add_argument("--served-model-name", default=d["served_model_name"],
                   help="the model id clients send and /v1/models lists; default: --model")
    p.add_argument("--data-parallel-size", type=int, default=None,
                   help="engines to wait for (default: --data-parallel-size-local, or the number of "
                        "--engine-addresses)")
    p.add_argument("--data-parallel-size-local", type=int, default=None,
                   help=f"engines to start here; 0 = connect to --engine-addresses only (default: "
                        f"{d['data_parallel_size_local']}, 0 with --render-only)")
    p.add_argument("--engine-addresses", default="",
                   help="comma-separated tcp://HOST:PORT of the engine ranks, in rank order (with "
                        "--data-parallel-size-local 0)")
    p.add_argument("--backend", choices=("vllm", "sim"), default=d["backend"], help="for engines started here")
    p.add_argument("--engine-port", type=int, default=d["engine_port"], help="first port for engines started here")
    p.add_argument("--engine-arg", action="append", default=[], dest="engine_args",
                   help="extra flag for engines started here (repeatable), e.g. --engine-arg=--sim-instant")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="file holding the token sent in every engine handshake (the engines' token; surrounding "
                        "whitespace dropped); default: $ENGINE_AUTH_TOKEN, else none")
    p.add_argument("--auth-token", default=d["auth_token"],
                   help="the engine handshake token itself; it shows in `ps`: prefer --auth-token-file or "
                        "$ENGINE_AUTH_TOKEN")
    p.add_argument("--handshake-timeout", type=float, default=d["handshake_timeout_s"], dest="handshake_timeout_s",
                   help="seconds start-up waits for every engine to be ready before the process exits 1")
    p.add_argument("--engine-timeout", type=float, default=d["engine_timeout_s"], dest="engine_timeout_s",
                   help="seconds an engine may be silent before it is slow: it takes no new requests (they go to "
                        "other ranks) until it speaks again; its running requests wait (--engine-dead-timeout)")
    p.add_argument("--engine-dead-timeout", type=float, default=d["engine_dead_timeout_s"],
                   dest="engine_dead_timeout_s",
                   help="seconds an engine may be silent before it is dead: its running requests fail (those "
                        "that have no output yet go to another rank). A closed connection fails them at once. "
                        "Default: 5 times --engine-timeout (10 s)")
    p.add_argument("--shutdown-timeout", type=float, default=d["shutdown_timeout_s"], dest="shutdown_timeout_s",
                   help="on SIGTERM or SIGINT, seconds running requests may still finish while new ones get 503; "
                        "then each one left ends with an error (a stream: an error event and [DONE]); a second "
                        "signal ends them at once. The default is the engines' --drain-timeout")
    p.add_argument("--max-body-bytes", type=int, default=d["max_body_bytes"],
                   help="largest request body accepted, larger ones get 413; also every gRPC message's limit "
                        "(RESOURCE_EXHAUSTED past it; UpdateWeights takes a larger tensor in pieces)")
    p.add_argument("--header-timeout", type=float, default=d["header_timeout_s"], dest="header_timeout_s",
                   help="seconds a request's headers may take from its first byte (a connection's first request: "
                        "from its opening); a slower one is answered 408 and its connection closed (slowloris). "
                        "Also a request body's longest gap: no bytes for this long, or under "
                        f"{MIN_BODY_RATE} bytes a second after the first this long, is a 408 and a close (slow POST)")
    p.add_argument("--max-connections", type=int, default=d["max_connections"],
                   help="open connections each API server process holds; one more is answered 503 and closed at "
                        f"once. Keep it under the open-file limit (ulimit -n). Default: {DEFAULT_MAX_CONNECTIONS} "
                        "(uvicorn, hypercorn); granian cannot bound them")
    p.add_argument("--api-server-count", type=int, default=d["api_server_count"],
                   help="HTTP server processes sharing the port (SO_REUSEPORT), each with its own engine links")
    p.add_argument("--http-server", choices=HTTP_SERVERS, default=d["http_server"],
                   help="the ASGI server each API server process runs (docs/frontend.md compares them)")
    p.add_argument("--log-level", default=d["log_level"], choices=("debug", "info", "warning", "error"),
                   help="log level of every process started")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="serve tool_choice \"auto\" (the default beside tools): parse the model's tool calls "
                        "with --tool-call-parser, as vLLM's flag does")
    p.add_argument("--tool-call-parser", default=d["tool_call_parser"], metavar="NAME",
                   help=f"the model family's tool-call format ({', '.join(TOOL_PARSER_NAMES)}); default: none")
    p.add_argument("--reasoning-parser", default=d["reasoning_parser"], metavar="NAME",
                   help="split the model's reasoning into reasoning_content "
                        f"({', '.join(REASONING_PARSER_NAMES)}); default: none")
    p.add_argument("--render-only", action="store_true",
                   help="load the tokenizer, chat template and config only, connect to no engine: serve the render "
                        "routes, /tokenize and /detokenize (the generation routes answer 404)")
    p.add_argument("--max-model-len", type=int, default=d["max_model_len"],
                   help="with --render-only: the context length requests are checked against; default: the "
                        "model's config.json")
    p.add_argument("--max-logprobs", type=int, default=d["max_logprobs"],
                   help="most alternatives a request's logprobs, top_logprobs or prompt_logprobs may ask for "
                        "(more is a 400), as vLLM's flag; engines started here get the same --max-logprobs")
    p.add_argument("--stream-interval", type=int, default=d["stream_interval"],
                   help="tokens per streamed chunk, as vLLM's flag: a stream's response task is woken, and a chunk "
                        "sent, at its first token, then every N tokens and at its end; a request's "
                        "stream_interval may raise it, not lower it. Trades latency for CPU")
    p.add_argument("--max-request-choices", type=int, default=d["max_request_choices"],
                   help="most choices one request may ask for, n times its prompts (a completions batch): each "
                        "choice is an engine request of its own, so this bounds what one body puts in flight")
    p.add_argument("--grpc-port", type=int, default=d["grpc_port"],
                   help="serve the gRPC services (Inference, Control, RlControl, KvEvents; health and reflection) on "
                        "this port of --host, from API server 0; 0: not served")
    p.add_argument("--api-key", action="append", default=[], dest="api_keys", metavar="KEY",
                   help="a key clients must send (`Authorization: Bearer KEY`; gRPC metadata too) to the "
                        "generation, render and tokenize routes and every gRPC service but health "
                        "(repeatable; also $FLEET_API_KEY); default: none, open")
    p.add_argument(tracing.FLAG, default=d["otlp_traces_endpoint"], metavar="URL",
                   help="export OpenTelemetry traces over OTLP to this collector (vLLM's flag: grpc unless "
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf); passed to engines started here. "
                        "OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables configure it too; default: off")
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                   help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes; also "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, vLLM's switch): they load and unload adapters on "
                        "every ready engine rank, which must run with --enable-lora")
    return p


def parse_args(argv: list[str] | None = None) -> FrontendConfig:
    p = build_parser()
    ns = vars(p.parse_args(argv))
    addresses = tuple(a.strip() for a in ns.pop("engine_addresses").split(",") if a.strip())
    keys = ns.pop("api_keys") + ([os.environ["FLEET_API_KEY"]] if os.environ.get("FLEET_API_KEY") else [])
    if ns["data_parallel_size_local"] is None:
        default = next(f.default for f in fields(FrontendConfig) if f.name == "data_parallel_size_local")
        ns["data_parallel_size_local"] = 0 if ns["render_only"] else default
    local = ns["data_parallel_size_local"]
    if ns["data_parallel_size"] is None:
        ns["data_parallel_size"] = local if local > 0 else max(1, len(addresses))
    try:
        tracing.settings_from("frontend", os.environ, ns["otlp_traces_endpoint"])  # a bad setting fails here
        ns["auth_token"] = auth_token_from(ns["auth_token"], ns.pop("auth_token_file"), os.environ)
        return FrontendConfig(engine_addresses=addresses, engine_args=tuple(ns.pop("engine_args")),
                              api_keys=tuple(keys), **ns)
    except ValueError as exc:
        p.error(str(exc))
        raise
