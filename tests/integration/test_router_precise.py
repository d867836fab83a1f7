"""The precise_prefix policy over real processes: two instances (a frontend with --grpc-port over its
own headless sim engine each) behind a router pool that reads each frontend's KvEvents stream. A
prompt goes where its blocks were stored, and a rank whose engine restarts holds nothing any more. A
second pool on the same replicas sends a LoRA adapter's name as its model: its blocks are chained from
the adapter's root, as the engines chain them, and are not the base model's. A pool found by DNS
subscribes to each address the name resolves to, on `dns.grpc_port`."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.adapters import fake_adapter
from tests.support.procs import (
    EngineProc,
    FrontendProc,
    HttpProc,
    free_port_block,
    start_engine,
    start_frontend,
    start_router,
)

KEY = "sk-precise"
PREFIX = " ".join(f"Fact {i}: the {i}th lantern of the harbour burns copper-green." for i in range(40))
DEADLINE_S = 30.0


# Each engine serves the base model and the LoRA adapter `ad` (the sim loads nothing from its directory).
SIM = ("--model", "tiny", "--backend", "sim", "--sim-decode-ms", "1", "--block-size", "16")


def _sim(tmp: Path) -> tuple[str, ...]:
    return (*SIM, "--lora-modules", f"ad={fake_adapter(tmp, 'ad')}")


@dataclass
class Fleet:
    tmp: Path
    engines: list[EngineProc]
    frontends: list[FrontendProc]
    router: HttpProc
    grpc_ports: list[int]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("router-precise")
    engines: list[EngineProc] = []
    frontends: list[FrontendProc] = []
    router = None
    grpc_ports: list[int] = []
    try:
        replicas = []
        for _ in range(2):
            engine = start_engine(tmp, *_sim(tmp))
            engines.append(engine)
            grpc_port = free_port_block(1, spread=0)
            grpc_ports.append(grpc_port)
            fe = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                "--engine-addresses", engine.endpoint(), "--grpc-port", str(grpc_port),
                                "--api-key", KEY)
            frontends.append(fe)
            replicas.append(f"{{url: {fe.url}, grpc: '127.0.0.1:{grpc_port}'}}")
        pools = "".join(f"""
  {model}:
    model: {model}
    api_key: {KEY}
    tokenizer: tiny
    policy: precise_prefix
    precise_prefix: {{cache_threshold: 0.3, reconnect_max_s: 0.5}}
    replicas: [{", ".join(replicas)}]
    health: {{path: /ready, interval_s: 1}}""" for model in ("tiny", "ad"))  # the base model, an adapter
        router = start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:{pools}
entries:
  assistant: {{default: [tiny]}}
  adapted: {{default: [ad]}}
""")
        yield Fleet(tmp, engines, frontends, router, grpc_ports)
    finally:
        for proc in [router, *frontends, *engines]:
            if proc is not None:
                proc.stop()


def _body(question: str, prefix: str = PREFIX, model: str = "assistant") -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{prefix}\n\nQuestion: {question}"}]}


def _decision(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(fleet.router.url + "/v1/router/explain", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _until(fleet: Fleet, body: dict[str, Any], holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The router's decision for `body` once `holds(decision)`: KV events reach it a moment after the engine."""
    deadline = time.monotonic() + DEADLINE_S
    while not holds(decision := _decision(fleet, body)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no such decision within {DEADLINE_S}s; the last: {decision}\n"
                                 f"router log:\n{fleet.router.log()[-3000:]}")
        time.sleep(0.1)
    return decision


def test_a_prompt_goes_where_its_prefix_is_stored(fleet: Fleet) -> None:
    first = _until(fleet, _body("what burns?"), lambda d: "block size not known" not in d["reason"])
    assert first["reason"].startswith("precise_prefix: best 0/"), first
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json=_body("what burns?"), timeout=30)
    assert r.status_code == 200, r.text
    served = r.headers["x-router-replica"]
    # Another question after the same prefix: its leading blocks are on the replica that served the first.
    again = _until(fleet, _body("which lantern?"), lambda d: "held on rank 0" in d["reason"])
    assert again["replica"] == served, again
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json=_body("which lantern?"), timeout=30)
    assert r.status_code == 200 and r.headers["x-router-replica"] == served
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 20
    # A prompt sharing nothing goes to the replica holding fewer blocks: the other one.
    other = _decision(fleet, _body("anything?", prefix="A different story altogether. " * 30))
    assert "<= 0.30 -> fewest blocks held or sent" in other["reason"] and other["replica"] != served, other


def test_a_restarted_engines_blocks_are_cleared(fleet: Fleet) -> None:
    body = _body("what is cleared?", prefix="Ledger line for clearing. " * 40)
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    served = r.headers["x-router-replica"]
    _until(fleet, body, lambda d: "held on rank 0" in d["reason"] and d["replica"] == served)
    index = [fe.url for fe in fleet.frontends].index(served)
    port = fleet.engines[index].port
    fleet.engines[index].stop()
    # The same engine address, a new session holding nothing: the frontend relays `cleared` for its rank.
    fleet.engines[index] = start_engine(fleet.tmp, *_sim(fleet.tmp), port=port)
    fleet.frontends[index].wait_ready()
    # (What was sent there counts as held for pending_s, 5 s, unless the engine reports it: then not.)
    _until(fleet, body, lambda d: d["status"] == "ok" and d["reason"].startswith("precise_prefix: best 0/"))


def test_an_adapter_pools_blocks_are_the_adapters_own(fleet: Fleet) -> None:
    prefix = "Adapter ledger entry, copied out in a careful hand. " * 30
    body = _body("adapted?", prefix=prefix, model="adapted")
    _until(fleet, body, lambda d: "block size not known" not in d["reason"])
    r = httpx.post(fleet.router.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "ad"  # the frontend ran it with the adapter
    served = r.headers["x-router-replica"]
    again = _until(fleet, _body("adapted again?", prefix=prefix, model="adapted"),
                   lambda d: "held on rank 0" in d["reason"])
    assert again["replica"] == served, again
    # The same prompt for the base model shares none of them: the engines chain an adapter's from its root.
    base = _decision(fleet, _body("adapted again?", prefix=prefix))
    assert base["reason"].startswith("precise_prefix: best 0/"), base


def test_a_dns_pool_reads_the_kv_events_of_each_address(fleet: Fleet) -> None:
    fe, grpc_port = fleet.frontends[0], fleet.grpc_ports[0]
    router = start_router(fleet.tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  tiny:
    model: tiny
    api_key: {KEY}
    tokenizer: tiny
    policy: precise_prefix
    precise_prefix: {{reconnect_max_s: 0.5}}
    dns: {{name: localhost, port: {fe.port}, grpc_port: {grpc_port}, refresh_s: 1}}
    health: {{path: /ready, interval_s: 1}}
entries:
  assistant: {{default: [tiny]}}
""")
    try:
        dns = Fleet(fleet.tmp, fleet.engines, fleet.frontends, router, fleet.grpc_ports)
        body = _body("found by name?", prefix="A register of names, resolved and kept. " * 30)
        _until(dns, body, lambda d: "block size not known" not in d["reason"])
        r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-router-replica"] == f"http://127.0.0.1:{fe.port}"
        _until(dns, _body("found again?", prefix="A register of names, resolved and kept. " * 30),
               lambda d: "held on rank 0" in d["reason"])
    finally:
        router.stop()
