"""`make up`: the fleet on this machine as separate processes: headless engine ranks, a frontend with
--data-parallel-size-local 0 that connects to them, and the router in front (deploy/router.yaml).
Prints the router's URL, the one to use; Ctrl-C stops everything."""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from protocol.handshake import TOKEN_ENV

ENGINE_PORT = 5555
ROUTER_CONFIG = Path(__file__).resolve().parent.parent / "router.yaml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="vllm", choices=("vllm", "sim"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="tiny")
    p.add_argument("--router-config", type=Path, default=ROUTER_CONFIG)
    args = p.parse_args()
    py = sys.executable
    # One handshake token for the engines and the frontend (theirs if set, else a fresh one), passed in
    # the environment: other users of this machine reach loopback ports too.
    env = {**os.environ, TOKEN_ENV: os.environ.get(TOKEN_ENV) or secrets.token_hex(32)}
    engines = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", args.model,
                                "--backend", args.backend, "--host", "127.0.0.1", "--port", str(ENGINE_PORT),
                                "--data-parallel-size-local", str(args.ranks)], env=env)
    addresses = ",".join(f"tcp://127.0.0.1:{ENGINE_PORT + i}" for i in range(args.ranks))
    frontend = subprocess.Popen([py, "-m", "services.frontend", "--model", args.model, "--host", "127.0.0.1",
                                 "--port", str(args.port), "--data-parallel-size", str(args.ranks),
                                 "--data-parallel-size-local", "0", "--engine-addresses", addresses], env=env)
    router = subprocess.Popen([py, "-m", "services.router", "--config", str(args.router_config)])
    procs = [router, frontend, engines]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    frontend_url = f"http://127.0.0.1:{args.port}"
    url = f"http://127.0.0.1:{_first_port(args.router_config)}"
    announced = False
    while not stopping and all(proc.poll() is None for proc in procs):
        if not announced and _ok(frontend_url + "/ready") and _ok(url + "/health"):
            announced = True
            print(f"\nfleet ready: {url} (the router: entries tiny, auto, careful; see deploy/router.yaml)\n"
                  f"  behind it: frontend {frontend_url}, {args.ranks} {args.backend} engine ranks, model "
                  f"{args.model}\n  routing decisions: POST /v1/router/explain on the ops listener\n"
                  f"try:\n  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
                  f"    -d '{{\"model\": \"auto\", \"messages\": [{{\"role\": \"user\", \"content\": "
                  f"\"Hello!\"}}], \"max_tokens\": 32}}'\nCtrl-C stops it.\n", flush=True)
        time.sleep(0.5)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0 if stopping else 1


def _first_port(config: Path) -> int:
    from services.router.config import load_config

    return load_config(config).listeners[0].port


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
