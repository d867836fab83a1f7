"""The shipped dashboards (deploy/observability/grafana: vLLM's published one and the router's) on a real
Prometheus scraping a running fleet (a sim engine, a frontend, a router in front) with the shipped scrape
config: every panel's every query, its Grafana variables filled in as Grafana would, returns data a panel
draws after traffic through the router with the openai SDK. A panel that goes empty fails the test."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import HttpProc, free_port_block, start_engine, start_frontend, start_router
from tests.support.prometheus import Prometheus, finite, running, wait_scraped
from tests.support.waiting import until

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "observability" / "grafana"
MODEL = "tiny"  # the frontend's served model name: vLLM's dashboard's $model_name
SCRAPE_S = 1

# The test's router: what the router dashboard charts needs a queue (one slot, two waiting), a rate
# limit, the semantic cache (exact hits only: no embedding model is started), signals, and a pool with a
# replica that refuses connections (upstream errors, retries). Ops is the listener Prometheus scrapes,
# keyless, as in deploy/compose/router.yaml.
ROUTER = """
listeners:
  - name: public
    host: 127.0.0.1
    port: {port}
    api_keys: [k-main, k-limited]
    keys:
      - {key: k-main, name: main}
      - {key: k-limited, name: limited, tenant: limited, limits: {requests_per_minute: 1}}
    apis: [chat, completions, models]
  - name: ops
    host: 127.0.0.1
    port: OPS
    apis: [models, explain]
pools:
  tiny:
    model: tiny
    replicas: [{url: "FRONTEND"}]
    tokenizer: tiny
    max_inflight: 1
    queue_size: 2
    health: {path: /ready, interval_s: 2}
  flaky:
    model: tiny
    replicas: [{url: "DEAD"}, {url: "FRONTEND"}]
    policy: round_robin
    health: {path: /ready, interval_s: 3600}
deployments:
  minilm: {model: minilm, tasks: [embed], attached: {urls: ["DEAD"]}}
store: {path: STORE}
entries:
  tiny:
    default: [tiny]
    plugins: [{type: semantic_cache, embedder: minilm, semantic: false, store_truncated: true}]
  auto:
    signals:
      - {name: long, type: context_length, min_tokens: 2000}
      - {name: urgent, type: keyword, keywords: [urgent, asap]}
    decisions:
      - {name: urgent, when: urgent, pools: [tiny]}
    default: [tiny]
  flaky:
    default: [flaky]
"""


@dataclass
class Fleet:
    router: HttpProc
    ops_url: str
    prometheus: Prometheus

    def client(self, key: str = "k-main") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.router.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the router's `name` samples with these labels, read from its ops /metrics."""
        text = httpx.get(self.ops_url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def _refusing_port(stack: ExitStack) -> int:
    """A loopback port bound and never listened on, for the fixture's life: a connection to it is refused
    (no other process can take the port meanwhile, as it could a port merely found free)."""
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", 0))
    return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The processes start together (the frontend waits for its engine's handshake, the router's health
    checks for the frontend) and are waited for after; each is stopped on the way out, last first."""
    tmp = tmp_path_factory.mktemp("dashboards")
    with ExitStack() as stack:
        engine = start_engine(tmp, "--model", MODEL, "--backend", "sim", "--sim-decode-ms", "10", wait=False)
        stack.callback(engine.stop)
        fe = start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                            "--engine-addresses", engine.endpoint(), wait_status=None)
        stack.callback(fe.stop)
        ops = free_port_block(1, spread=0)
        dead = f"http://127.0.0.1:{_refusing_port(stack)}"
        config = (ROUTER.replace("OPS", str(ops)).replace("FRONTEND", fe.url).replace("DEAD", dead)
                  .replace("STORE", str(tmp / "router.db")))
        router = start_router(tmp, config, wait=False)
        stack.callback(router.stop)
        targets = {"frontend:8000": f"127.0.0.1:{fe.port}", "router:8081": f"127.0.0.1:{ops}"}
        prometheus = stack.enter_context(running(tmp, targets, SCRAPE_S))
        engine.wait_ready()
        fe.wait_ready()
        router.wait_http()
        router.wait_ready()
        yield Fleet(router, f"http://127.0.0.1:{ops}", prometheus)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _queue_round(fleet: Fleet) -> None:
    """Pool tiny (one slot, two places in its queue): A holds the slot, B waits and is served, C waits and
    leaves, D finds the queue full (429); then A's client leaves too. Each step waits on the router's
    own gauges, so the order is the one laid out."""
    pool = {"pool": "tiny"}
    base_served = fleet.metric("router_queue_served_total", **pool)
    base_abandoned = fleet.metric("router_queue_abandoned_total", **pool)
    with fleet.client() as client:
        a = client.chat.completions.create(model="auto", messages=_chat("hold the slot"), max_tokens=2000,
                                           stream=True)  # the head came: A has the slot
        until("A in flight", lambda: True if fleet.metric("router_replica_inflight", **pool) == 1 else None)
        answers: list[str] = []
        b = threading.Thread(target=lambda: answers.append(str(client.chat.completions.create(
            model="auto", messages=_chat("wait for it"), max_tokens=4).choices[0].message.content)))
        b.start()
        until("B queued", lambda: True if fleet.metric("router_queue_depth", **pool) == 1 else None)
        body = json.dumps({"model": "auto", "messages": _chat("leave the queue"), "max_tokens": 4}).encode()
        c = socket.create_connection(("127.0.0.1", fleet.router.port))
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\nauthorization: Bearer k-main\r\n"
                  b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        until("C queued", lambda: True if fleet.metric("router_queue_depth", **pool) == 2 else None)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="auto", messages=_chat("no room"), max_tokens=4)
        c.close()
        until("C abandoned", lambda: True if fleet.metric("router_queue_abandoned_total", **pool) > base_abandoned
              else None)
        a.close()  # A's client leaves: the slot goes to B
        b.join(60)
        assert answers and not b.is_alive()
        assert fleet.metric("router_queue_served_total", **pool) == base_served + 1


def _traffic_round(fleet: Fleet) -> None:
    with fleet.client() as client:
        for _ in range(2):  # the second is the semantic cache's exact hit (once the first is stored)
            r = client.chat.completions.create(model="tiny", messages=_chat("hello"), max_tokens=8, temperature=0)
            assert r.choices[0].finish_reason in ("stop", "length")
        chunks = list(client.chat.completions.create(model="auto", messages=_chat("urgent: stream it"),
                                                     max_tokens=8, stream=True))
        assert chunks and chunks[-1].choices[-1].finish_reason in ("stop", "length")
        text = "".join(c.choices[0].text for c in client.completions.create(
            model="auto", prompt="a completion", max_tokens=6, stream=True) if c.choices)
        assert text
        with pytest.raises(openai.NotFoundError):  # an error the router answers itself
            client.chat.completions.create(model="no-such-model", messages=_chat("hi"), max_tokens=4)
        with pytest.raises(openai.BadRequestError):  # and one the frontend answers
            client.chat.completions.create(model="tiny", messages=_chat("hi"), max_tokens=10**7)
        for _ in range(3):  # round robin: one of the first two goes to the replica that refuses, and is retried
            client.chat.completions.create(model="flaky", messages=_chat("retry me"), max_tokens=4)
    with fleet.client("k-limited") as limited:
        with pytest.raises(openai.RateLimitError):  # one request a minute: the second, or both in round 2
            for _ in range(2):
                limited.chat.completions.create(model="tiny", messages=_chat("limited"), max_tokens=4)
    _queue_round(fleet)


# ---- Grafana's side: variables, as Grafana fills them in ----

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]")


def _rate_interval(step_s: int) -> str:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    return f"{max(step_s + SCRAPE_S, 4 * SCRAPE_S)}s"


def _variables(dashboard: dict[str, Any], prometheus: Prometheus, step_s: int, range_s: int) -> dict[str, str]:
    """Each templating variable's value: a data source is not in the queries' text; a query variable
    takes the served model name where it offers it, its `allValue` where it may be All, and must offer
    something (else its panels could only be empty)."""
    values = {"__rate_interval": _rate_interval(step_s), "__interval": f"{step_s}s", "__range": f"{range_s}s",
              "__interval_ms": str(step_s * 1000), "__range_s": str(range_s)}
    for var in dashboard.get("templating", {}).get("list", []):
        if var["type"] == "datasource":
            continue
        assert var["type"] == "query", f"variable {var['name']}: type {var['type']!r} is not filled in by this test"
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", query.strip())
        assert m is not None, f"variable {var['name']}: query {query!r} is not label_values(...)"
        series, label = m.groups()
        offered = prometheus.api("series", **{"match[]": series}) if series else None
        found = sorted({s[label] for s in offered if label in s}) if offered is not None else \
            list(prometheus.api(f"label/{label}/values"))
        assert found, f"variable {var['name']}: {query} offers no value"
        if var.get("includeAll"):
            values[var["name"]] = var.get("allValue") or "(" + "|".join(map(re.escape, found)) + ")"
        else:
            assert MODEL in found, f"variable {var['name']}: {query} offers {found}, not {MODEL!r}"
            values[var["name"]] = MODEL
    return values


def _filled(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        assert name in values, f"{expr!r}: variable ${name} is not defined (known: {sorted(values)})"
        return values[name]

    return _VARIABLE.sub(one, expr)


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])  # a collapsed row holds its panels
        else:
            yield panel


def _empty(dashboard: dict[str, Any], fleet: Fleet, start: float, end: float) -> tuple[int, list[str]]:
    """The dashboard's panel count, and each query that returned nothing a panel would draw, or an error."""
    step = SCRAPE_S
    values = _variables(dashboard, fleet.prometheus, step, int(end - start))
    panels, empty = 0, []
    for panel in _panels(dashboard):
        panels += 1
        assert panel.get("targets"), f"panel {panel['title']!r} has no queries"
        for target in panel["targets"]:
            expr = _filled(target["expr"], values)
            try:
                result = fleet.prometheus.query_range(expr, start, end, step)
            except AssertionError as exc:  # Prometheus refused the query: listed with the empty ones
                empty.append(f"{panel['title']!r} {target['refId']}: {expr}\n    {exc}")
                continue
            if not finite(result):
                empty.append(f"{panel['title']!r} {target['refId']}: {expr}")
    return panels, empty


@pytest.fixture(scope="module")
def scraped(fleet: Fleet) -> tuple[float, float]:
    """Two rounds of the same traffic, each until Prometheus scraped after it: a series a round creates
    is seen moving in the next (rate() and increase() need two samples that differ)."""
    start = wait_scraped(fleet.prometheus) - 2 * SCRAPE_S
    _traffic_round(fleet)
    wait_scraped(fleet.prometheus)
    _traffic_round(fleet)
    wait_scraped(fleet.prometheus)
    # A step past the last scrape that saw the traffic: the range holds a window with its last change.
    end = time.time() + SCRAPE_S
    fleet.prometheus.scraped_after(end)
    return start, end


@pytest.mark.parametrize("name", ["vllm.json", "router.json"])
def test_every_panel_of_the_dashboard_shows_data(fleet: Fleet, scraped: tuple[float, float], name: str) -> None:
    dashboard = json.loads((GRAFANA / name).read_text())
    panels, empty = _empty(dashboard, fleet, *scraped)
    print(f"{name}: {panels} panels, every query with data")  # the figure the issue asks for (pytest -s)
    assert not empty, f"{name}: {len(empty)} of its queries returned no data or an error:\n" + "\n".join(empty)
    assert panels == {"vllm.json": 13, "router.json": 16}[name]


def test_prometheus_scrapes_the_shipped_jobs(fleet: Fleet, scraped: tuple[float, float]) -> None:
    """The targets are the shipped config's jobs, both up: a renamed job or path shows here first."""
    expected = {("fleet-frontend", "frontend", "up"), ("fleet-router", "router", "up")}

    def jobs() -> set[tuple[str, str | None, str]]:
        return {(t["labels"]["job"], t["labels"].get("service"), t["health"]) for t in fleet.prometheus.targets()}

    until(f"the shipped jobs up (now {jobs()})", lambda: True if jobs() == expected else None, 30)
