"""One API-key rule on every face (edge/api_keys.py): the same table of ways a client presents a key, each
sent to the frontend's HTTP, the frontend's gRPC and the router (a listener with the same keys, in front of
that frontend), over real sockets; every face accepts and refuses the same ones."""
from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from protocol.grpc import pb2, pb2_grpc
from tests.integration.conftest import SIM
from tests.support.procs import free_port_block, start_engine, start_frontend, start_router

KEY, OTHER = "k-one", "k-two"
Headers = list[tuple[str, str]]

# (how the key is presented, accepted?)
TABLE: list[tuple[Headers, bool]] = [
    ([], False),
    ([("authorization", f"Bearer {KEY}")], True),
    ([("authorization", f"Bearer {OTHER}")], True),  # any of the keys
    ([("authorization", f"bearer {KEY}")], True),  # the scheme in any case
    ([("authorization", f"BEARER    {KEY}")], True),
    ([("x-api-key", KEY)], True),
    ([("authorization", f"Basic {KEY}"), ("x-api-key", KEY)], True),  # not a Bearer: x-api-key is the key
    ([("authorization", "Bearer wrong"), ("x-api-key", KEY)], False),  # a Bearer key is the key presented
    ([("x-api-key", KEY), ("x-api-key", "wrong")], True),  # the first x-api-key
    ([("x-api-key", "wrong"), ("x-api-key", KEY)], False),
    ([("authorization", KEY)], False),  # no scheme
    ([("authorization", f"Bearer {KEY}x")], False),
    ([("authorization", f"Bearer {KEY[:-1]}")], False),
    ([("authorization", "Bearer")], False),  # a scheme, no key
    ([("x-api-key", "")], False),
]


class Faces:
    def __init__(self, frontend_url: str, grpc_port: int, router_url: str) -> None:
        self.frontend_url, self.router_url = frontend_url, router_url
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.inference = pb2_grpc.InferenceStub(self.channel)

    def frontend_http(self, headers: Headers) -> bool:
        r = httpx.post(self.frontend_url + "/v1/completions", headers=headers, timeout=30,
                       json={"model": "tiny", "prompt": "x", "max_tokens": 1})
        assert r.status_code in (200, 401), r.text
        return r.status_code == 200

    def frontend_grpc(self, headers: Headers) -> bool:
        req = pb2.GenerateRequest(token_ids=[1, 2, 3], sampling_params=pb2.SamplingParams(max_tokens=1))
        try:
            self.inference.Generate(req, metadata=headers, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc.details()
            return False
        return True

    def router(self, headers: Headers) -> bool:
        r = httpx.post(self.router_url + "/v1/completions", headers=headers, timeout=30,
                       json={"model": "fleet", "prompt": "x", "max_tokens": 1})
        assert r.status_code in (200, 401), r.text
        return r.status_code == 200


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faces]:
    tmp = tmp_path_factory.mktemp("api-key-rule")
    engine = start_engine(tmp, *SIM, "--sim-decode-ms", "1")
    grpc_port = free_port_block(1, spread=0)
    frontend = router = None
    try:
        frontend = start_frontend(tmp, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                                  "--grpc-port", str(grpc_port), "--api-key", KEY, "--api-key", OTHER)
        router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [{KEY}, {OTHER}]}}]
pools:
  tiny: {{model: tiny, api_key: {KEY}, replicas: [{{url: {frontend.url}}}]}}
entries:
  fleet: {{default: [tiny]}}
""")
        f = Faces(frontend.url, grpc_port, router.url)
        yield f
        f.channel.close()
    finally:
        for proc in (router, frontend, engine):
            if proc is not None:
                proc.stop()


@pytest.mark.parametrize(("headers", "accepted"), TABLE, ids=[repr(h) for h, _ in TABLE])
def test_every_face_accepts_and_refuses_the_same_presentations(faces: Faces, headers: Headers,
                                                                accepted: bool) -> None:
    got = {"frontend HTTP": faces.frontend_http(headers), "frontend gRPC": faces.frontend_grpc(headers),
           "router": faces.router(headers)}
    assert got == dict.fromkeys(got, accepted)
