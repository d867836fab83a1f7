"""`router --config router.yaml [MODEL] [--port P]` (router mode) or `router -e MODEL [MODEL ...]` (engine mode:
System One for those models alone): the mode's config built and validated (every problem, by key path or
by flag, then exit 2), logging set up, served."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import tracing
from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, MIN_BODY_RATE
from services.router.config import BACKENDS, ConfigError, RouterConfig, load_config
from services.router.modes import (
    API_KEYS_ENV,
    DEFAULT_EMBEDDER,
    ENGINE_HOST,
    ENGINE_PORT,
    Listen,
    ModeError,
    Workers,
    api_keys,
    engine_config,
    engine_models,
    with_default_model,
)
from services.router.server import DEFAULT_SHUTDOWN_TIMEOUT_S, run, run_loop

log = logging.getLogger("router")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="router", description="The public entry of the fleet: API keys, "
                                     "model selection by signals and decisions, replica scheduling. Router mode "
                                     "(--config) routes chat and serves the System One models its listeners "
                                     "publish; engine mode (-e) serves System One for the models it names, alone.")
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="router mode: the default decision model, an embedding model (a --model value: "
                             "minilm, a path) served by managed workers (deployment "
                             f"{DEFAULT_EMBEDDER!r}) for the signals that embed without naming a deployment, "
                             "in place of the in-process all-MiniLM-L6-v2")
    parser.add_argument("--config", type=Path,
                        help="router YAML: listeners, pools, entries (docs/router-config.md); validated at start. "
                             "Router mode needs it; in engine mode it is loaded, checked and left inactive (its "
                             "first listener's host, port and API keys serve unless flags give them)")
    parser.add_argument("-e", "--engine", nargs="+", metavar="MODEL",
                        help="engine mode: serve the System One API for these decision models (each a --model "
                             "value, or NAME=MODEL to publish it as NAME; embedding, classifier or cross-encoder "
                             "checkpoints) on managed workers; no chat backend, no routing file needed")
    parser.add_argument("--engine-backend", choices=BACKENDS,
                        help="the managed workers' engine backend (engine mode's models, router mode's MODEL); "
                             "default: vllm")
    parser.add_argument("--replicas", type=int,
                        help="managed workers (engine + frontend) per model (engine mode's, router mode's "
                             "MODEL); default: 1")
    parser.add_argument("--host",
                        help=f"engine mode: its listener's address; default: the --config file's first "
                             f"listener's, else {ENGINE_HOST}")
    parser.add_argument("--port", type=int,
                        help="router mode: serve the first listener on this port instead of its configured one; "
                             f"engine mode: its listener's port (default: the --config file's, else {ENGINE_PORT})")
    parser.add_argument("--api-key", action="append", metavar="KEY",
                        help=f"engine mode: an API key its listener accepts (repeatable; or ${API_KEYS_ENV}, "
                             "comma separated); default: the --config file's first listener's, else open")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                        help="seconds a request's headers may take from its first byte (a connection's first "
                             "request: from its opening); a slower one is answered 408 and its connection closed "
                             "(slowloris). Also a request body's longest gap: no bytes for this long, or under "
                             f"{MIN_BODY_RATE} bytes a second after the first this long, is a 408 and a close "
                             "(slow POST). "
                             f"Default: {DEFAULT_HEADER_TIMEOUT_S:g}")
    parser.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                        help="on SIGTERM or SIGINT the listeners take no new connection and the requests running "
                             "(streams too) may finish for this many seconds; those still running then are cut "
                             "and the router exits. Keep the deployment's grace period above it. "
                             f"Default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g} (the frontend's --shutdown-timeout)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="open connections each listener holds; one more is answered 503 and closed at once. "
                             f"Keep it under the open-file limit (ulimit -n). Default: {DEFAULT_MAX_CONNECTIONS}")
    parser.add_argument(tracing.FLAG, metavar="URL",
                        help="export OpenTelemetry traces over OTLP to this collector (as vLLM's flag: grpc unless "
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf); OTEL_EXPORTER_OTLP_ENDPOINT "
                             "and the other OTEL_* variables configure it too. Default: off (docs/tracing.md)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="log level (default: info)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.header_timeout > 0:
        parser.error(f"--header-timeout: expected > 0 seconds, got {args.header_timeout}")
    if not args.shutdown_timeout >= 0:
        parser.error(f"--shutdown-timeout: expected >= 0 seconds, got {args.shutdown_timeout}")
    if args.max_connections < 1:
        parser.error(f"--max-connections: expected >= 1, got {args.max_connections}")
    if args.port is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port: expected 1..65535, got {args.port}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.dump_stacks_on_usr1()
    try:
        config, inactive = engine_mode(args) if args.engine else router_mode(args)
    except ModeError as exc:
        parser.error(str(exc))
    try:
        tracing.configure("router", args.otlp_traces_endpoint)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        code = run_loop(run(config, header_timeout_s=args.header_timeout, max_connections=args.max_connections,
                            shutdown_timeout_s=args.shutdown_timeout, inactive=inactive))
    finally:
        tracing.shutdown()  # the spans still batched are exported before the process exits
    sys.exit(code)


def engine_mode(args: argparse.Namespace) -> tuple[RouterConfig, RouterConfig | None]:
    """(what is served, the routing file given: loaded and inactive)."""
    if args.model is not None:
        raise ModeError(f"MODEL {args.model!r}: a positional MODEL is router mode's default decision model; in "
                        "engine mode list every model after -e")
    workers = Workers(args.engine_backend or "vllm", 1 if args.replicas is None else args.replicas)
    models = engine_models(args.engine)
    routing = _load(args.config) if args.config is not None else None
    listen = Listen(args.host, args.port, api_keys(args.api_key, os.environ))
    return engine_config(models, workers, listen, routing), routing


def router_mode(args: argparse.Namespace) -> tuple[RouterConfig, None]:
    if args.config is None:
        given = f"MODEL {args.model!r} alone: " if args.model is not None else ""
        raise ModeError(f"{given}router mode needs --config FILE (its MODEL is optional); engine mode needs "
                        "-e MODEL [MODEL ...]")
    for flag, value in (("--host", args.host), ("--api-key", args.api_key)):
        if value is not None:
            raise ModeError(f"{flag}: engine mode's (-e); in router mode the --config file's listeners give it")
    if args.model is None:
        for flag, value in (("--engine-backend", args.engine_backend), ("--replicas", args.replicas)):
            if value is not None:
                raise ModeError(f"{flag}: for the workers the command line starts: engine mode's models (-e), "
                                "or router mode's MODEL; none is given")
    config = _load(args.config)
    if args.port is not None:
        first, *rest = config.listeners
        config = replace(config, listeners=(replace(first, port=args.port), *rest))
    if args.model is not None:
        workers = Workers(args.engine_backend or "vllm", 1 if args.replicas is None else args.replicas)
        config, moved = with_default_model(config, args.model, workers)
        log.info("default decision model: %s (deployment %s) for %d signal(s) that embed without a deployment",
                 args.model, DEFAULT_EMBEDDER, moved)
    return config, None


def _load(path: Path) -> RouterConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"router: invalid config ({len(exc.errors)} problem(s)):", file=sys.stderr)
        for error in exc.errors:
            print(f"  {exc.source}: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
