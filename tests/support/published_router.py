"""A real router process for tests whose YAML uses `pools.X.outputs` and `listeners[].pools`:
`python -m tests.support.published_router router.yaml`. Those two keys are taken out of the YAML, the
rest parsed as `router --config` parses it, and they are set on the parsed config (PoolConfig.outputs,
ListenerConfig.pools), so these tests run whether or not the config reader knows the keys yet; the
process then serves as the router's own CLI does."""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.router.config import parse_config
from services.router.config.loader import read_yaml
from services.router.server import run, run_loop
from tests.support.procs import HttpProc, free_port_block


def start(tmp_path: Path, config: str) -> HttpProc:
    """The router serving `config` (YAML; `{port}` in it replaced by a free port), once it answers /ready."""
    import subprocess

    import httpx

    port = free_port_block(1, spread=0)
    path = tmp_path / f"router-{port}.yaml"
    path.write_text(config.replace("{port}", str(port)))
    log_path = tmp_path / f"router-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.published_router", str(path)],
                                stdout=log, stderr=subprocess.STDOUT)
    router = HttpProc(proc, port, log_path)
    try:
        router.wait_http()
        deadline = time.monotonic() + 60
        while httpx.get(router.url + "/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.05)
    except BaseException:
        router.stop()
        raise
    return router


def main() -> None:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source = sys.argv[1]
    raw: Any = read_yaml(Path(source))
    outputs = {name: tuple(pool.pop("outputs")) for name, pool in raw["pools"].items() if "outputs" in pool}
    published = [tuple(listener.pop("pools", ())) for listener in raw["listeners"]]
    config = parse_config(raw, source)
    config = replace(config,
                     pools={name: replace(pool, outputs=outputs.get(name, pool.outputs))
                            for name, pool in config.pools.items()},
                     listeners=tuple(replace(listener, pools=pools)
                                     for listener, pools in zip(config.listeners, published, strict=True)))
    sys.exit(run_loop(run(config)))


if __name__ == "__main__":
    main()
