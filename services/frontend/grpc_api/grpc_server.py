"""The frontend's gRPC server (--grpc-port; protocol/grpc/fleet/v1/fleet.proto), assembled: token-in
Inference (inference.py), Control (control.py), RlControl (rl_control.py) and KvEvents (kv_relay.py),
with the standard health service and reflection, behind the API-key check (auth.py), on API server
0's event loop beside its HTTP server. The port is the frontend's own HTTP/2 server (grpc_port.py):
it serves Inference.GenerateStream and Generate and RlControl.UpdateWeights itself and relays every
other call to grpc.aio, which listens on an internal Unix socket only.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from edge.api_keys import ApiKeys
from protocol.grpc import pb2, pb2_grpc, service_names
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.grpc_api.auth import Auth
from services.frontend.grpc_api.control import Control
from services.frontend.grpc_api.grpc_port import GrpcPort
from services.frontend.grpc_api.in_flight import PUBLISH_S
from services.frontend.grpc_api.inference import Inference
from services.frontend.grpc_api.kv_relay import KvEvents, KvRelay
from services.frontend.grpc_api.rl_control import RlControl

log = logging.getLogger(__name__)

# What a response may carry (our own output: a long prompt's prompt_logprobs).
MAX_SEND_BYTES = 1 << 30


class GrpcServer:
    """The gRPC services on this process's loop. start() binds (raises OSError when the port cannot be
    had), stop(grace) ends it: running calls get `grace` seconds."""

    def __init__(self, core: FrontendCore, relay: KvRelay, *, host: str, port: int, api_keys: Sequence[str],
                 others_in_flight: Callable[[int], int] = lambda index: 0) -> None:
        """`others_in_flight(i)`: the other API servers' requests on rank index i (in_flight.py), for GetLoads."""
        self.core, self.relay = core, relay
        self._host, self._port = host, port
        interceptors = [Auth(api_keys)] if api_keys else []
        # Every method's messages are bounded by HTTP's body limit, UpdateWeights' too (a tensor larger than
        # that comes in pieces). gRPC checks a message's length from its 5-byte prefix and refuses a larger
        # one, RESOURCE_EXHAUSTED, before it holds its bytes; one limit for the whole server is all grpcio
        # offers (it has no per-method one).
        self.max_message_bytes = core.config.max_body_bytes
        self.server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", MAX_SEND_BYTES), ("grpc.so_reuseport", 0)])
        self.inference = Inference(core)
        # Inference's requests reach the handlers serialized: translation parses them where it would parse
        # an HTTP body (in a worker process when long), not the event loop.
        # Embed's and Classify's are parsed on the loop: token ids only, bounded by the same message limit.
        out = pb2.GenerateResponse.SerializeToString
        pool_in, pool_out = pb2.PoolRequest.FromString, pb2.PoolResponse.SerializeToString
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fleet.v1.Inference", {
            "Generate": grpc.unary_unary_rpc_method_handler(self.inference.Generate, response_serializer=out),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(self.inference.GenerateStream),
            "Embed": grpc.unary_unary_rpc_method_handler(self.inference.Embed, request_deserializer=pool_in,
                                                         response_serializer=pool_out),
            "Classify": grpc.unary_unary_rpc_method_handler(self.inference.Classify, request_deserializer=pool_in,
                                                            response_serializer=pool_out)}),))
        control = Control(core, self.inference, time.time(), others_in_flight)
        pb2_grpc.add_ControlServicer_to_server(control, self.server)
        rl_control = RlControl(core)
        pb2_grpc.add_RlControlServicer_to_server(rl_control, self.server)
        pb2_grpc.add_KvEventsServicer_to_server(KvEvents(relay), self.server)
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection([*service_names(), health_name, reflection.SERVICE_NAME], self.server)
        self._inner = tempfile.mkdtemp(prefix="fleet-grpc-")  # grpc.aio's socket's directory (ours alone)
        self.wire = GrpcPort(self.inference, ApiKeys(api_keys), self.max_message_bytes,
                             os.path.join(self._inner, "grpc.sock"), weights=rl_control)
        self.port = 0

    async def start(self) -> None:
        address = f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"
        inner = f"unix:{self.wire.upstream}"
        try:
            bound = self.server.add_insecure_port(inner)
        except RuntimeError as exc:
            raise OSError(f"gRPC: cannot listen on {inner}: {exc}") from None
        if not bound:
            raise OSError(f"gRPC: cannot listen on {inner}")
        await self.server.start()
        try:
            self.port = await self.wire.start(self._host, self._port)
        except OSError as exc:
            await self.server.stop(0)
            raise OSError(f"--grpc-port {self._port}: cannot listen on {address}: {exc}") from None
        await self.set_serving(bool(self.core.engines.serving()))
        log.info("gRPC serving %s:%d (%s; health, reflection)", self._host, self.port,
                 ", ".join(s.rsplit(".", 1)[1] for s in service_names()))
        servers = self.core.config.api_server_count
        if servers > 1:
            log.info("gRPC is served by API server 0 of %d: GetLoads' in_flight adds the other API servers' requests "
                     "(published every %.1f s), KvEvents relays every rank's events (each API server subscribes to "
                     "every engine's), Control.Abort ends calls made over gRPC (all of them on API server 0)",
                     servers, PUBLISH_S)

    async def set_serving(self, serving: bool) -> None:
        """The health service's answer, overall and per service: SERVING while some rank takes requests (/ready)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *service_names()):
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(self.wire.stop(grace), self.server.stop(grace))
        shutil.rmtree(self._inner, ignore_errors=True)
