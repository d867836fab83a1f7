"""`frontend` CLI: parse flags, set up logging, run API server 0 (which starts any others)."""
from __future__ import annotations

import logging
import sys

from services.frontend.config import parse_args
from services.frontend.server import run, run_loop


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run_loop(run(config)))


if __name__ == "__main__":
    main()
