"""What a streamed gRPC message costs the server below the frontend: reference servers that do no work but
the gRPC layer, each sending a prebuilt GenerateResponse to N concurrent GenerateStream calls at a paced
cadence (one timer per step wakes every stream, as the engine's outputs do), measured side by side:
- aio: grpc.aio (the frontend's server) on uvloop, an async generator yielding the message's bytes;
- aio-pb: the same yielding a protobuf message object (the frontend's GenerateStream);
- aio-write: a coroutine calling context.write(bytes) instead of a generator;
- h2: an asyncio protocol with h2 for the connection's state, each message's DATA frame built by hand and
  written to the transport (flow-control windows charged as h2 would; the floor of a lower gRPC layer);
- h2-send: the same with h2's own send_data per message (what an h2-based server, grpclib, pays);
- sync: grpc's threaded server, a generator per call in a pool thread, a condition notified per step.
Each server is its own process; the grpc.aio client runs in this one, whose CPU is not counted.
Usage: python bench/grpc_floor.py [--streams 256] [--messages 200] [--repeat 3] [--step-ms 20]
                                  [--servers aio,aio-pb,aio-write,h2,h2-send,sync]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frontend_stream import _cpu_seconds, _free_port  # noqa: E402

from protocol.grpc import pb2, pb2_grpc  # noqa: E402

METHOD = "/fleet.v1.Inference/GenerateStream"


class Ticker:
    """One timer per step; every stream awaits the step's future, as streams await the engine's outputs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, step_s: float) -> None:
        self._loop, self._step_s = loop, step_s
        self.step: asyncio.Future[None] = loop.create_future()
        loop.call_later(step_s, self._tick)

    def _tick(self) -> None:
        done, self.step = self.step, self._loop.create_future()
        done.set_result(None)
        self._loop.call_later(self._step_s, self._tick)


def _message(i: int) -> pb2.GenerateResponse:
    return pb2.GenerateResponse(request_id="gen-0123456789abcdef", token_ids=[1000 + i % 1000])


def _count(request: bytes) -> int:
    return pb2.GenerateRequest.FromString(request).sampling_params.max_tokens


async def _serve_aio(port: int, kind: str, ticker: Ticker) -> None:
    async def generator(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(_count(request)):
            await ticker.step
            yield _message(i).SerializeToString()

    async def objects(request: bytes, context: Any) -> AsyncIterator[pb2.GenerateResponse]:
        for i in range(_count(request)):
            await ticker.step
            yield _message(i)

    async def writer(request: bytes, context: Any) -> None:
        for i in range(_count(request)):
            await ticker.step
            await context.write(_message(i).SerializeToString())

    handler = {"aio": generator, "aio-pb": objects, "aio-write": writer}[kind]
    serializer = pb2.GenerateResponse.SerializeToString if kind == "aio-pb" else None
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fleet.v1.Inference", {
        "GenerateStream": grpc.unary_stream_rpc_method_handler(handler, response_serializer=serializer)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


class _H2Server(asyncio.Protocol):
    """One HTTP/2 connection: h2 parses the client's frames and writes headers and trailers; the messages'
    DATA frames are written by hand (kind h2) or by h2 (h2-send)."""

    def __init__(self, ticker: Ticker, by_hand: bool) -> None:
        import h2.config
        import h2.connection

        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self._ticker, self._by_hand = ticker, by_hand
        self._bodies: dict[int, bytes] = {}
        self._transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._h2.initiate_connection()
        transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        import h2.events

        for event in self._h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self._bodies[event.stream_id] = b""
            elif isinstance(event, h2.events.DataReceived):
                self._bodies[event.stream_id] += event.data
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                body = self._bodies.pop(event.stream_id)
                asyncio.get_running_loop().create_task(self._stream(event.stream_id, body[5:]))
        self._flush()

    def _flush(self) -> None:
        out = self._h2.data_to_send()
        if out:
            self._transport.write(out)

    async def _stream(self, sid: int, request: bytes) -> None:
        self._h2.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        self._flush()
        stream = self._h2.streams[sid]
        frame_sid = sid.to_bytes(4, "big")
        for i in range(_count(request)):
            await self._ticker.step
            payload = _message(i).SerializeToString()
            data = b"\x00" + len(payload).to_bytes(4, "big") + payload  # gRPC's prefix: not compressed, length
            if not self._by_hand:
                self._h2.send_data(sid, data)
                self._flush()
                continue
            # A floor, not a server: the client's windows (grpc's, grown by its BDP probes) never run out here.
            if len(data) > min(self._h2.outbound_flow_control_window, stream.outbound_flow_control_window):
                raise RuntimeError("flow-control window exhausted: this floor does not wait for WINDOW_UPDATE")
            self._h2.outbound_flow_control_window -= len(data)
            stream.outbound_flow_control_window -= len(data)
            # DATA frame: 24-bit length, type 0, no flags, stream id.
            self._transport.write(len(data).to_bytes(3, "big") + b"\x00\x00" + frame_sid + data)
        self._h2.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        self._flush()


def _serve_sync(port: int, step_s: float) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    step = threading.Condition()
    steps = [0]

    def tick() -> None:
        while True:
            time.sleep(step_s)
            with step:
                steps[0] += 1
                step.notify_all()

    def generator(request: bytes, context: Any) -> Any:
        seen = steps[0]
        for i in range(_count(request)):
            with step:
                while steps[0] == seen:
                    step.wait()
                seen = steps[0]
            yield _message(i).SerializeToString()

    threading.Thread(target=tick, daemon=True).start()
    server = grpc.server(ThreadPoolExecutor(max_workers=1100), maximum_concurrent_rpcs=1024,
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fleet.v1.Inference", {
        "GenerateStream": grpc.unary_stream_rpc_method_handler(generator)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def serve(port: int, kind: str, step_s: float) -> None:
    import uvloop

    if kind == "sync":
        _serve_sync(port, step_s)
        return

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ticker = Ticker(loop, step_s)
        if kind.startswith("aio"):
            await _serve_aio(port, kind, ticker)
            return
        server = await loop.create_server(lambda: _H2Server(ticker, kind == "h2"), "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


async def _round(port: int, streams: int, messages: int) -> int:
    request = pb2.GenerateRequest(token_ids=[1], sampling_params=pb2.SamplingParams(max_tokens=messages))
    # Several channels (HTTP/2 connections), as bench/grpc_stream.py opens; one carries at most ~100 streams.
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(max(1, streams // 64))]
    stubs = [pb2_grpc.InferenceStub(c) for c in channels]

    async def one(i: int) -> int:
        return sum([len(r.token_ids) async for r in stubs[i % len(stubs)].GenerateStream(request, timeout=600,
                                                                                  wait_for_ready=True)])

    try:
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))
    finally:
        for c in channels:
            await c.close()


def _wait_serving(port: int) -> None:
    deadline = time.monotonic() + 60
    while asyncio.run(_round(port, 1, 1)) != 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port}: no answer")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--messages", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--servers", default="aio,aio-pb,aio-write,h2,h2-send,sync")
    p.add_argument("--serve", nargs=2, metavar=("PORT", "KIND"), help=argparse.SUPPRESS)  # a server's process
    args = p.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], args.step_ms / 1e3)
        return
    kinds = args.servers.split(",")
    for kind in kinds:
        if kind not in ("aio", "aio-pb", "aio-write", "h2", "h2-send", "sync"):
            p.error(f"--servers: {kind!r} is not one of aio, aio-pb, aio-write, h2, h2-send, sync")
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for kind in kinds:
            port = _free_port()
            procs[kind] = (subprocess.Popen([sys.executable, __file__, "--serve", str(port), kind,
                                             "--step-ms", str(args.step_ms)]), port)
        for _, port in procs.values():
            asyncio.run(_round(port, 16, 10))  # serving (the calls wait for it), then warm
        per: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for kind, (proc, port) in procs.items():  # alternating: every server sees the same machine
                cpu0 = _cpu_seconds(proc.pid)
                n = asyncio.run(_round(port, args.streams, args.messages))
                assert n == args.streams * args.messages, (kind, n)
                per[kind].append((_cpu_seconds(proc.pid) - cpu0) / n * 1e6)
        base = statistics.median(per[kinds[0]])
        print(f"server CPU per streamed message, {args.streams} GenerateStream calls x {args.messages} messages, "
              f"a step every {args.step_ms:g} ms (median of {args.repeat}):")
        for kind, runs in per.items():
            m = statistics.median(runs)
            runs_text = ", ".join(f"{x:.1f}" for x in runs)
            print(f"  {kind:10s} {m:6.1f} us  x{m / base:.2f} of {kinds[0]}  (runs: {runs_text})")
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(30)


if __name__ == "__main__":
    main()
