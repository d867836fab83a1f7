"""`python -m services.engine.probe --port P`: exit 0 once the engine rank on P answers a handshake.

Run by a Kubernetes exec readiness probe. The engine has no HTTP port, and its ROUTER socket is bound
before the model loads (launcher.run_rank), so a TCP probe would pass during the load. A Hello is
answered with Ready only by the core loop, which starts after the backend is built, and is refused
while the rank drains: exactly "loaded and serving". The probe's session expires on the engine after
--client-timeout, like a frontend that went away.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import zmq

from protocol import Ready, Reject, decode, encode, make_hello


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine-probe", description="Exit 0 if the engine rank answers Hello with "
                                "Ready, 1 otherwise (refused, or no answer within --timeout).")
    p.add_argument("--host", default="127.0.0.1", help="engine host (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5555, help="the rank's ROUTER port (default: 5555)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer (default: 2)")
    return p


def probe(host: str, port: int, timeout_s: float, auth_token: str | None = None) -> tuple[bool, str]:
    """(ready, what the engine said)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://{host}:{port}")
        sock.send_multipart(encode(make_hello(f"probe-{socket.gethostname()}-{os.getpid()}", auth_token)))
        # Heartbeats may come first once the session exists; only Ready or Reject settles it.
        while sock.poll(int(timeout_s * 1000)):
            msg = decode(sock.recv_multipart())
            if isinstance(msg, Ready):
                return True, f"rank {msg.rank} ready: model={msg.model} backend={msg.backend}"
            if isinstance(msg, Reject):
                return False, f"refused: {msg.code}: {msg.reason}"
        return False, f"no answer within {timeout_s:g}s (loading, or not running)"
    finally:
        sock.close()
        ctx.term()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    ok, said = probe(args.host, args.port, args.timeout, os.environ.get("ENGINE_AUTH_TOKEN") or None)
    print(said)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
