"""Kill-to-abort: seconds from SIGKILL of a frontend with a request in flight to the engine rank having
aborted it (its `stats` utility reports nothing in flight), sim backend, default --client-timeout (5 s).

The frontend is a stand-in process (one DEALER: handshake, one long request); a second peer watches by
calling `stats` in a loop, so the resolution is one round trip (about a millisecond).
Usage: python bench/peer_disconnect.py [--runs 5] [--root CHECKOUT]   (--root: the engine code to run,
e.g. a clone of main, to compare)
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import Outputs, Ready, UtilityCall, UtilityResult, decode, encode, make_hello  # noqa: E402

PEER = """
import sys, threading, time, zmq
from protocol import GenerateRequest, Heartbeat, Outputs, Ready, SamplingParams, decode, encode, make_hello
s = zmq.Context().socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send_multipart(encode(make_hello("bench-doomed")))
while not isinstance(decode(s.recv_multipart()), Ready):
    pass
s.send_multipart(encode(GenerateRequest("doomed", list(range(1000, 1064)), SamplingParams(max_tokens=3000), 0.0)))
while not isinstance(decode(s.recv_multipart()), Outputs):
    pass
print("running", flush=True)
seq = 0
while True:  # a live frontend beats; only SIGKILL ends this
    seq += 1
    s.send_multipart(encode(Heartbeat(seq, time.time())))
    while s.poll(100):
        s.recv_multipart()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Watcher:
    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.sock.send_multipart(encode(make_hello("bench-watcher")))
        while not isinstance(self._recv(60), Ready):
            pass
        self.call = 0

    def _recv(self, timeout_s: float) -> object:
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError("the engine did not answer")
        return decode(self.sock.recv_multipart())

    def in_flight(self) -> int:
        self.call += 1
        self.sock.send_multipart(encode(UtilityCall(self.call, "stats", {})))
        while True:
            msg = self._recv(10)
            if isinstance(msg, UtilityResult) and msg.call_id == self.call:
                return int(msg.result["in_flight"])
            if isinstance(msg, Outputs):
                continue


def kill_to_abort(endpoint: str, watcher: Watcher) -> float:
    peer = subprocess.Popen([sys.executable, "-c", PEER, endpoint], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert peer.stdout is not None
    try:
        if peer.stdout.readline() != "running\n":
            raise RuntimeError("the stand-in frontend did not start its request")
        if watcher.in_flight() != 1:
            raise RuntimeError("expected the stand-in's request in flight")
        t0 = time.perf_counter()
        peer.send_signal(signal.SIGKILL)
        while watcher.in_flight():
            if time.perf_counter() - t0 > 60:
                raise TimeoutError("not aborted within 60 s")
        return time.perf_counter() - t0
    finally:
        peer.kill()
        peer.wait()
        peer.stdout.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--root", type=Path, default=ROOT, help="checkout whose engine runs (default: this one)")
    args = p.parse_args()
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    engine = subprocess.Popen([sys.executable, "-m", "services.engine", "--headless", "--model", "tiny", "--backend",
                               "sim", "--host", "127.0.0.1", "--port", str(port), "--sim-decode-ms", "2"],
                              cwd=args.root, env={**os.environ, "PYTHONPATH": str(args.root)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        watcher = Watcher(endpoint)
        times = [kill_to_abort(endpoint, watcher) for _ in range(args.runs)]
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(30)
    print(f"engine code: {args.root}")
    print(f"kill-to-abort over {len(times)} SIGKILLed frontends (s): median {statistics.median(times):.3f}, "
          f"min {min(times):.3f}, max {max(times):.3f}")


if __name__ == "__main__":
    main()
