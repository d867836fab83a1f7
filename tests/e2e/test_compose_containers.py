"""The real compose file (compose.yaml + compose.sim.yaml) run in containers with podman by
`python -m deploy.compose`, one `up` for the module: traffic through the router's published port with the
openai and anthropic SDKs, the health-gated start order from podman's own record, the healthchecks kept
while up, an engine container killed and restarted to serving, every service's logs, and `down` leaving
nothing of the project."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anthropic
import openai
import pytest

from deploy.compose import health
from tests.support.compose import ComposeFleet, fleet_up
from tests.support.images import slim
from tests.support.waiting import until

SERVICES = ("engine-0", "engine-1", "frontend", "router")
# The first test carries the module's fleet: the slim image's build when its inputs changed (minutes on vfs,
# more when other builds share the storage), then `up`.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def fleet() -> Iterator[ComposeFleet]:
    slim()  # the sim override runs every service on the slim image (built once per machine)
    fleet = fleet_up("compose.yaml", "compose.sim.yaml")
    try:
        yield fleet
    finally:
        if any(fleet.leftovers().values()):  # a test failed before the teardown test took it down
            fleet.cli("down", "-v", "-t", "5")


def _events(fleet: ComposeFleet) -> list[dict[str, Any]]:
    """podman's event log for the project's containers (start, health_status, died, restart, ...)."""
    out = fleet.podman.run("events", "--stream=false", "--since", "15m", "--format", "json",
                           "--filter", f"label=io.podman.compose.project={fleet.project}").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _when(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["Time"]))


def _first(events: list[dict[str, Any]], name: str, status: str) -> datetime:
    found = [_when(e) for e in events if e["Name"] == name and e["Status"] == status]
    assert found, f"no {status} event of {name}: {[(e['Name'], e['Status']) for e in events]}"
    return min(found)


def _healthy_at(events: list[dict[str, Any]], name: str) -> datetime:
    """When `name`'s first passing check ended. podman 4.3 logs each check as a health_status event holding
    the status before that check, then the check's exec_died: the first event that says healthy comes
    after the check that passed, which is the last check to end before it."""
    first_healthy = min(_when(e) for e in events if e["Name"] == name and e.get("health_status") == "healthy")
    return max(_when(e) for e in events if e["Name"] == name and e["Status"] == "exec_died"
               and _when(e) <= first_healthy)


def test_chat_and_stream_through_the_router(fleet: ComposeFleet) -> None:
    with openai.OpenAI(base_url=fleet.router_url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8)
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 8 and reply.choices[0].message.content
        chunks = list(client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_messages_through_the_router(fleet: ComposeFleet) -> None:
    with anthropic.Anthropic(base_url=fleet.router_url, api_key="unused", max_retries=0, timeout=30) as client:
        message = client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
        assert message.content[0].type == "text" and message.content[0].text


def test_each_service_started_after_its_dependencies_were_healthy(fleet: ComposeFleet) -> None:
    """From podman's event log: each engine passed a check before the frontend started, the frontend before
    the router started (podman-compose alone starts them all at once on podman < 4.6)."""
    names = {s: fleet.container(s) for s in SERVICES}

    def each_reported_healthy() -> list[dict[str, Any]] | None:
        # a check after the passing one says "healthy": the keeper runs one within an interval or so
        events = _events(fleet)
        return events if all(any(e["Name"] == n and e.get("health_status") == "healthy" for e in events)
                             for n in names.values()) else None

    events = until("a health_status event saying healthy for each service", each_reported_healthy, 60, 0.5)
    frontend_started = _first(events, names["frontend"], "start")
    for engine in ("engine-0", "engine-1"):
        assert _first(events, names[engine], "start") < _healthy_at(events, names[engine]) < frontend_started
    assert frontend_started < _healthy_at(events, names["frontend"]) < _first(events, names["router"], "start")


def test_healthchecks_keep_running_while_up(fleet: ComposeFleet) -> None:
    """What podman's systemd timer does elsewhere: `up -d` returned, and checks still run, so podman ps
    shows health."""
    def checked_since_up() -> list[dict[str, Any]] | None:
        state = fleet.inspect("router")["State"]
        log = (state.get("Healthcheck") or state.get("Health") or {}).get("Log") or []
        later = [e for e in log if datetime.fromisoformat(e["Start"]).timestamp() > fleet.up_done]
        return later or None

    assert all(e["ExitCode"] == 0 for e in until("a check of the router after up returned", checked_since_up, 60, 0.5))
    assert {s: health.status(fleet.inspect(s)) for s in SERVICES} == {s: "healthy" for s in SERVICES}


def test_killed_engine_container_is_restarted_and_serves_again(fleet: ComposeFleet) -> None:
    before = fleet.inspect("engine-0")["State"]
    killed_at = time.time()
    os.kill(before["Pid"], signal.SIGKILL)  # its main process, from the host: a crash, not a user's stop
    until("engine-0 restarted", lambda: (s := fleet.inspect("engine-0")["State"])["Running"]
          and s["Pid"] != before["Pid"] or None, 60, 0.2)
    assert fleet.inspect("engine-0")["RestartCount"] >= 1

    def rank_0_ready() -> dict[str, Any] | None:
        out = fleet.exec_python("frontend", "import urllib.request; print(urllib.request.urlopen("
                                "'http://localhost:8000/ready', timeout=5).read().decode())")
        try:
            body = json.loads(out)
        except ValueError:
            return None
        return body if 0 in body.get("ranks", []) and not body.get("missing") else None

    until("the frontend's /ready with rank 0 back", rank_0_ready, 90, 0.5)
    # The other rank served on meanwhile. podman's DNS did not resolve the restarted engine's name for
    # ~40 s here; when every rank shared one ZMQ I/O thread, each blocked lookup silenced rank 1 too and
    # the frontend declared it dead (services/frontend/engine_client/bridge.py: a context per rank).
    since = fleet.podman.run("logs", "--since", str(int(killed_at) - 1), fleet.container("frontend"), check=False)
    frontend_log = since.stdout + since.stderr
    assert "engine rank 0 is dead" in frontend_log and "engine rank 1 is dead" not in frontend_log, frontend_log[-3000:]
    # A request pinned to rank 0 at the frontend (the router does not pass the pin on): served by it.
    served = fleet.exec_python("frontend", (
        "import json, urllib.request; r = urllib.request.urlopen(urllib.request.Request("
        "'http://localhost:8000/v1/chat/completions', json.dumps({'model': 'tiny', 'max_tokens': 4, "
        "'messages': [{'role': 'user', 'content': 'Hi'}]}).encode(), {'Content-Type': 'application/json', "
        "'X-Data-Parallel-Rank': '0'}), timeout=30); print(r.status, r.headers['x-data-parallel-rank'])"))
    assert served.split() == ["200", "0"], served
    # And through the router, once its health check (every 2 s, deploy/compose/router.yaml) has seen the
    # frontend ready again: while no rank was ready it answered 503 naming the replica, as it should.
    def through_the_router() -> str | None:
        with openai.OpenAI(base_url=fleet.router_url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            try:
                return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                      max_tokens=4).choices[0].message.content
            except openai.InternalServerError as e:
                assert e.status_code == 503 and "no ready replica" in str(e), e
                return None

    assert until("an answer through the router", through_the_router, 30, 0.5)


def test_logs_show_every_service(fleet: ComposeFleet) -> None:
    done = fleet.cli("logs", timeout_s=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    # podman-compose prefixes each line with its service: [engine-0] | ...
    lines = {s: [x for x in text.splitlines() if f"[{s}]" in x] for s in SERVICES}
    assert any("rank 0" in x for x in lines["engine-0"]) and any("rank 1" in x for x in lines["engine-1"]), text[-3000:]
    assert any("serving http://0.0.0.0:8000" in x for x in lines["frontend"]), text[-3000:]
    assert any("Uvicorn running on http://0.0.0.0:8080" in x for x in lines["router"]), text[-3000:]


def test_down_leaves_nothing(fleet: ComposeFleet) -> None:
    keeper_pid = int((fleet.podman.root / "compose" / f"{fleet.project}.keeper.pid").read_text())
    assert all(fleet.leftovers().values())  # there was something to take down
    done = fleet.cli("down", "-v", timeout_s=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert fleet.leftovers() == {"containers": [], "networks": [], "volumes": [], "pods": []}
    with pytest.raises(ProcessLookupError):
        os.kill(keeper_pid, 0)
