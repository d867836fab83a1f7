"""The gRPC port's relay (grpc_api/relay.py) keeps the client connection's receive window whole: the
bytes of a relayed call that grpc.aio had no room for yet are granted back to the client when the call
ends without them (the client resets it). Behind the port, a grpc.aio stand-in that takes the connection
and never grants window (a handler slow to read, as a weight update's can be)."""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import h2.config
import h2.connection
import h2.events

from edge.api_keys import ApiKeys
from services.frontend.grpc_api.grpc_port import GrpcPort

RELAYED = "/fleet.v1.RlControl/UpdateWeights"


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads everything, answers nothing: no SETTINGS, no WINDOW_UPDATE, no response."""
    try:
        while await reader.read(1 << 20):
            pass
    finally:
        writer.close()


class _Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.writer.write(self.h2.data_to_send())

    async def round_trip(self) -> None:
        """A PING and its ACK: every frame sent before it has been read and answered."""
        self.h2.ping(b"roundtrp")
        self.writer.write(self.h2.data_to_send())
        while True:
            data = await asyncio.wait_for(self.reader.read(1 << 20), 10)
            assert data, "the port closed the connection"
            events = self.h2.receive_data(data)
            self.writer.write(self.h2.data_to_send())
            if any(isinstance(e, h2.events.PingAckReceived) for e in events):
                return

    def relayed_call_reset_with_a_full_window(self) -> int:
        """A relayed call: HEADERS, as many bytes as the windows allow, then RST_STREAM (CANCEL)."""
        h2c = self.h2
        sid = h2c.get_next_available_stream_id()
        h2c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", RELAYED),
                               (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        sent = 0
        while (room := min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size)) > 0:
            h2c.send_data(sid, b"\0" * room)
            sent += room
        h2c.reset_stream(sid, 8)
        self.writer.write(h2c.data_to_send())
        return sent


def test_a_reset_relayed_call_gives_back_the_connection_window_its_unsent_bytes_held() -> None:
    """Relayed.on_reset (relay.py) drops the call's buffered bytes (_to_up) without acknowledging
    _up_owed to the client's connection, so every relayed call reset while grpc.aio was slow to read takes
    up to a stream window (4 MiB) out of the connection window (16 MiB) for good: after four, nothing on
    that connection can send a byte (every call on it hangs). Held now: after the resets the port grants
    the bytes back (h2 sends WINDOW_UPDATE once half the window is consumed), so the client's connection
    window is back above half. Before the fix: it stays near 0."""
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            inner = str(Path(tmp) / "grpc.sock")
            stand_in = await asyncio.start_unix_server(_silent, inner)
            wire = GrpcPort(None, ApiKeys([]), 1 << 20, inner)  # type: ignore[arg-type]  # relays only here
            port = await wire.start("127.0.0.1", 0)
            client = _Client(*await asyncio.open_connection("127.0.0.1", port))
            try:
                await client.round_trip()  # the port's SETTINGS and its 16 MiB connection window are in
                full = client.h2.outbound_flow_control_window
                assert full == 16 << 20
                sent = 0
                for _ in range(4):
                    sent += client.relayed_call_reset_with_a_full_window()
                    await client.round_trip()
                assert sent > 12 << 20  # the calls did fill the window
                (conn,) = wire.connections
                assert conn.calls == {}
                left = client.h2.outbound_flow_control_window
                assert left > full // 2, f"the connection's window is {left} of {full} after the resets"
            finally:
                client.writer.close()
                await client.writer.wait_closed()
                await wire.stop(0)
                stand_in.close()
                await stand_in.wait_closed()
    asyncio.run(main())
