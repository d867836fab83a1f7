"""Slowloris against each HTTP server of the fleet, with its default flags: N connections that send a
request line and then one header byte a second, never finishing their headers, and N that send
nothing. Then slow POST: N that send complete headers (content-length 3 KB) and 10 body bytes, then a
body byte a second, and N that stop after those 10 bytes. Prints, per server and attack, how many the
server closed within --wait seconds and when (--header-timeout, 10 s by default, bounds both: the
headers, and a body's gaps and its rate), and whether a normal request was served meanwhile. The
frontend runs render-only (no engine) under uvicorn and hypercorn; the router with one pool.

Usage: .venv/bin/python bench/slowloris.py [--connections 50] [--wait 30] [--root CHECKOUT]
--root runs the servers of another checkout (a clone of main, say): its code, this script's driver.
"""
from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import HttpProc, start_frontend, start_router  # noqa: E402

ROUTER = """
listeners: [{port: {port}, host: 127.0.0.1}]
pools:
  p: {model: m, replicas: [{url: "http://127.0.0.1:9"}]}
entries:
  fleet: {default: [p]}
"""


def post_head(path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 3000\r\n\r\n{\"messages\": [").encode()  # and then a byte a second, or nothing


def attack(proc: HttpProc, connections: int, wait_s: float, opening: bytes = b"GET /health HTTP/1.1\r\nHost: x\r\n",
           stalled: bytes = b"", kinds: tuple[str, str] = ("trickling headers", "sending nothing")) -> str:
    """Open the connections: half send `opening` and then a byte a second, half send `stalled` and then
    nothing; watch which the server closes."""
    sel = selectors.DefaultSelector()
    opened = time.monotonic()
    socks = []
    for i in range(2 * connections):
        sock = socket.create_connection(("127.0.0.1", proc.port))
        sock.setblocking(False)
        slow = i % 2 == 0
        if slow or stalled:
            sock.send(opening if slow else stalled)
        sel.register(sock, selectors.EVENT_READ, slow)
        socks.append(sock)
    served = httpx.get(proc.url + "/health", timeout=10).status_code == 200
    closed: dict[bool, list[float]] = {True: [], False: []}
    next_byte = time.monotonic() + 1.0
    while time.monotonic() < opened + wait_s and len(closed[True]) + len(closed[False]) < len(socks):
        for key, _ in sel.select(timeout=max(0.0, min(next_byte, opened + wait_s) - time.monotonic())):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except ConnectionError:
                data = b""
            if not data:  # a 408's bytes come first, then the close
                closed[key.data].append(time.monotonic() - opened)
                sel.unregister(key.fileobj)
        if time.monotonic() >= next_byte:
            next_byte += 1.0
            for key in list(sel.get_map().values()):
                if key.data:
                    try:
                        key.fileobj.send(b"X")  # type: ignore[union-attr]
                    except (BlockingIOError, ConnectionError):
                        pass
    for sock in socks:
        sock.close()

    def line(kind: str, times: list[float]) -> str:
        if not times:
            return f"{kind}: 0/{connections} closed within {wait_s:g} s"
        return (f"{kind}: {len(times)}/{connections} closed, median {statistics.median(times):.1f} s, "
                f"last {max(times):.1f} s")

    return (f"{line(kinds[0], closed[True])}; {line(kinds[1], closed[False])}; "
            f"a normal request meanwhile: {'served' if served else 'NOT served'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=50, help="slowloris connections of each kind, per server")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to watch for the server closing them")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose servers run")
    args = p.parse_args()
    root = args.root.resolve()
    os.chdir(root)  # `python -m services...` runs the code of the working directory
    os.environ["PYTHONPATH"] = str(root)
    print(f"checkout {root}: {args.connections} connections trickling headers and {args.connections} sending "
          f"nothing, then {args.connections} trickling a body and {args.connections} stalling theirs, per server, "
          f"each watched for {args.wait:g} s")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("frontend uvicorn", "frontend hypercorn", "router"):
            proc = (start_router(Path(tmp), ROUTER) if name == "router"
                    else start_frontend(Path(tmp), "--render-only", "--http-server", name.split()[1]))
            try:
                print(f"{name}: {attack(proc, args.connections, args.wait)}", flush=True)
                head = post_head("/v1/router/explain" if name == "router" else "/v1/chat/completions/render")
                kinds = ("trickling a body", "body stalled")
                print(f"{name}: {attack(proc, args.connections, args.wait, head, head, kinds)}", flush=True)
            finally:
                proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
