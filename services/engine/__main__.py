"""`engine` CLI: parse flags, then run one rank here or supervise one process per local rank."""
from __future__ import annotations

import sys

import tracing
from services.engine.config import parse_args
from services.engine.launcher import run_rank, setup_logging, supervise


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    setup_logging()
    tracing.dump_stacks_on_usr1()
    if config.data_parallel_size_local == 1:
        sys.exit(run_rank(config.for_local_rank(0)))
    sys.exit(supervise(config))


if __name__ == "__main__":
    main()
