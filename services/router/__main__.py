"""`router --config router.yaml [--port P]`: validate the config (every problem, by key path, then
exit 2), set up logging, serve."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, MIN_BODY_RATE
from services.router.config import ConfigError, load_config
from services.router.server import run, run_loop


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="router", description="The public entry of the fleet: API keys, "
                                     "model selection by signals and decisions, replica scheduling.")
    parser.add_argument("--config", required=True, type=Path,
                        help="router YAML: listeners, pools, entries (docs/router-config.md); validated at start")
    parser.add_argument("--port", type=int,
                        help="serve the first listener on this port instead of its configured one; "
                             "default: the config's")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                        help="seconds a request's headers may take from its first byte (a connection's first "
                             "request: from its opening); a slower one is answered 408 and its connection closed "
                             "(slowloris). Also a request body's longest gap: no bytes for this long, or under "
                             f"{MIN_BODY_RATE} bytes a second after the first this long, is a 408 and a close "
                             "(slow POST). "
                             f"Default: {DEFAULT_HEADER_TIMEOUT_S:g}")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="open connections each listener holds; one more is answered 503 and closed at once. "
                             f"Keep it under the open-file limit (ulimit -n). Default: {DEFAULT_MAX_CONNECTIONS}")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="log level (default: info)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.header_timeout > 0:
        parser.error(f"--header-timeout: expected > 0 seconds, got {args.header_timeout}")
    if args.max_connections < 1:
        parser.error(f"--max-connections: expected >= 1, got {args.max_connections}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"router: invalid config ({len(exc.errors)} problem(s)):", file=sys.stderr)
        for error in exc.errors:
            print(f"  {exc.source}: {error}", file=sys.stderr)
        sys.exit(2)
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            parser.error(f"--port: expected 1..65535, got {args.port}")
        first, *rest = config.listeners
        config = replace(config, listeners=(replace(first, port=args.port), *rest))
    sys.exit(run_loop(run(config, header_timeout_s=args.header_timeout, max_connections=args.max_connections)))


if __name__ == "__main__":
    main()
