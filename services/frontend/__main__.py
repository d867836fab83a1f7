"""`frontend` CLI: parse flags, set up logging and the event loop, run the server."""
from __future__ import annotations

import asyncio
import logging
import sys

from services.frontend.config import parse_args
from services.frontend.server import run


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is optional: plain asyncio works, a little slower
        runner = asyncio.run
    sys.exit(runner(run(config)))


if __name__ == "__main__":
    main()
