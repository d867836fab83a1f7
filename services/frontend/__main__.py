"""`frontend` CLI: parse flags, set up logging, run API server 0 (which starts any others)."""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile

import tracing
from services.frontend.config import parse_args

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.dump_stacks_on_usr1()
    # Several API server processes answer /metrics as one: prometheus-client's multiprocess mode,
    # which it chooses when it is imported, so the directory is named before the server is.
    made = None
    if config.api_server_count > 1 and MULTIPROC_ENV not in os.environ:
        made = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="frontend-metrics-")
    from services.frontend.server import run, run_loop

    tracing.configure("frontend", config.otlp_traces_endpoint)  # checked by parse_args
    try:
        code = run_loop(run(config))
    finally:
        tracing.shutdown()  # the spans still batched are exported before the process exits
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
