"""deploy/k8s: every tree as `kubectl kustomize` renders it (the base, the cpu overlay) and every
manifest of optional/ validates against the Kubernetes 1.30 schemas offline; the cpu overlay changes
exactly the fields it means to; and what the schemas cannot see holds: container args parse with the
services' own CLI parsers, Services, probes and NetworkPolicies point at real ports and pods, the
frontends dial the StatefulSet's stable names, and the router's ConfigMap passes its config validation."""
from __future__ import annotations

import asyncio
import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from services.engine import probe
from services.engine.config import parse_args as engine_args
from services.frontend.config import parse_args as frontend_args
from services.router.__main__ import build_parser as router_parser
from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import request
from tests.support.fake_upstream import FakeUpstream
from tests.support.frontend_app import frontend_app

Resource = dict[str, Any]
Fleet = dict[tuple[str, str], Resource]

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
K8S_VERSION = "1.30"
TREES = {"base": K8S / "base", "cpu": K8S / "overlays" / "cpu"}
IMAGES = {"slim": "ghcr.io/fleet/fleet-slim:0.1.0", "cuda": "ghcr.io/fleet/fleet-engine-cuda:0.1.0",
          "cpu": "ghcr.io/fleet/fleet-engine-cpu:0.1.0"}

# The Prometheus Operator's CRDs are not among kubernetes_validate's schemas. A monitoring.coreos.com/v1
# manifest is checked against what a ServiceMonitor needs to scrape anything instead of being skipped;
# tests/e2e/test_dashboards.py checks its selector and ports against the Services.
MONITORING = "monitoring.coreos.com/v1"
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string",
                                                                                      "minLength": 1}}},
        "spec": {"type": "object", "required": ["selector", "endpoints"], "properties": {
            # Empty, it would select every Service in the namespace.
            "selector": {"type": "object", "minProperties": 1},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}]}}}},
    },
}


def kubectl_kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize DIRECTORY`: kubectl's built-in kustomize (v5), as `kubectl apply -k` renders."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: tests/unit/deploy/test_k8s.py renders deploy/k8s with "
                    "`kubectl kustomize` (kubectl 1.27 or later ships kustomize v5). Install kubectl "
                    "(on Debian: the Kubernetes apt repository's `kubectl` package).", pytrace=False)
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                          check=False)


def render(directory: Path) -> list[Resource]:
    run = kubectl_kustomize(directory)
    if run.returncode != 0:
        pytest.fail(f"`kubectl kustomize {directory}` exited {run.returncode}: {run.stderr.strip()}", pytrace=False)
    return [d for d in yaml.safe_load_all(run.stdout) if d is not None]


def _by_key(resources: list[Resource]) -> Fleet:
    by_key = {(r["kind"], r["metadata"]["name"]): r for r in resources}
    assert len(by_key) == len(resources), "two resources share a kind and name"
    return by_key


@pytest.fixture(scope="module")
def trees() -> dict[str, Fleet]:
    """Each tree rendered once for the module: one kubectl call per tree."""
    return {tree: _by_key(render(path)) for tree, path in TREES.items()}


@pytest.fixture(scope="module")
def optional() -> list[tuple[str, Resource]]:
    """optional/'s manifests, applied as they are (`kubectl apply -f`): no kustomization renders them."""
    return [(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}", doc)
            for path in sorted((K8S / "optional").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@pytest.fixture(params=sorted(TREES))
def fleet(request: pytest.FixtureRequest, trees: dict[str, Fleet]) -> tuple[str, Fleet]:
    return request.param, trees[request.param]


def _pod(workload: Resource) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _container(workload: Resource) -> dict[str, Any]:
    containers = _pod(workload)["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def _ports(workload: Resource) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in _container(workload)["ports"]}


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of args; a variable not given here is an error, not a no-op."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def _selects(selector: dict[str, str], workload: Resource) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def _workloads(fleet: Fleet) -> list[Resource]:
    return [r for (kind, _), r in fleet.items() if kind in ("Deployment", "StatefulSet")]


# Rendering and schemas


def test_every_kustomization_under_deploy_k8s_is_rendered_here() -> None:
    assert {p.parent for p in K8S.rglob("kustomization.yaml")} == set(TREES.values())


def test_a_missing_kubectl_fails_saying_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="kubectl is not on PATH"):
        render(TREES["cpu"])


def _validate(doc: Resource) -> None:
    """Raises, naming the field."""
    if doc["apiVersion"] == MONITORING:
        jsonschema.validate(doc, SERVICE_MONITOR)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("tree", [*sorted(TREES), "optional"])
def test_each_manifest_validates_against_the_kubernetes_schemas(
        tree: str, trees: dict[str, Fleet], optional: list[tuple[str, Resource]]) -> None:
    docs = optional if tree == "optional" else [(f"{kind}/{name}", r) for (kind, name), r in trees[tree].items()]
    assert docs
    failures = []
    for name, doc in docs:
        try:
            _validate(doc)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                jsonschema.ValidationError) as e:
            failures.append(f"{tree}: {name}: {e}")
    assert not failures, "\n".join(failures)


def test_a_misspelt_field_fails_validation(trees: dict[str, Fleet]) -> None:
    deployment = copy.deepcopy(trees["base"][("Deployment", "frontend")])
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def test_a_service_monitor_is_checked_and_an_unknown_kind_is_not_skipped() -> None:
    monitor = {"apiVersion": MONITORING, "kind": "ServiceMonitor", "metadata": {"name": "fleet"},
               "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "fleet"}},
                        "endpoints": [{"port": "http", "path": "/metrics"}, {"port": "metrics"}]}}
    _validate(monitor)
    for broken in ({"endpoints": []}, {"selector": {}}, {"endpoints": [{"path": "/metrics"}]}):
        with pytest.raises(jsonschema.ValidationError):
            _validate({**monitor, "spec": {**monitor["spec"], **broken}})
    with pytest.raises(jsonschema.ValidationError):  # no local expectation for another kind of the CRDs
        _validate({**monitor, "kind": "PodMonitor"})
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        _validate({**monitor, "apiVersion": "example.com/v1"})


# What the cpu overlay changes


ABSENT = "<absent>"
CONTAINER = "/spec/template/spec/containers/0"
# Each field the overlay changes, as a JSON pointer: (the base's value, the overlay's). A patch kustomize
# applies otherwise than meant shows here: a merge that keeps a GPU request, an image rule that misses,
# a positional patch on the wrong arg, a resource not dropped.
CPU_CHANGES: dict[tuple[str, str], dict[str, tuple[Any, Any]]] = {
    ("StatefulSet", "engine"): {
        f"{CONTAINER}/image": (IMAGES["cuda"], IMAGES["cpu"]),
        f"{CONTAINER}/args/4": ("/models/model", "tiny"),
        f"{CONTAINER}/resources/requests/cpu": ("4", "2"),
        f"{CONTAINER}/resources/requests/memory": ("32Gi", "4Gi"),
        f"{CONTAINER}/resources/requests/nvidia.com~1gpu": ("1", ABSENT),
        f"{CONTAINER}/resources/limits/memory": ("64Gi", "8Gi"),
        f"{CONTAINER}/resources/limits/nvidia.com~1gpu": ("1", ABSENT),
        "/spec/template/spec/nodeSelector": ({"nvidia.com/gpu.present": "true"}, ABSENT),
        "/spec/template/spec/tolerations": ([{"key": "nvidia.com/gpu", "operator": "Exists",
                                              "effect": "NoSchedule"}], ABSENT),
        "/spec/template/spec/volumes/0/emptyDir/sizeLimit": ("8Gi", "1Gi"),  # shm
        "/spec/volumeClaimTemplates/0/spec/resources/requests/storage": ("200Gi", "2Gi"),
    },
    ("Deployment", "frontend"): {
        f"{CONTAINER}/args/1": ("/models/model", "tiny"),
        f"{CONTAINER}/args/15": ("900", "300"),  # --handshake-timeout
        "/spec/template/spec/volumes/0/persistentVolumeClaim": ({"claimName": "model-files", "readOnly": True},
                                                                ABSENT),
        "/spec/template/spec/volumes/0/emptyDir": (ABSENT, {}),
    },
}


def _changes(base: Any, overlay: Any, path: str = "") -> dict[str, tuple[Any, Any]]:
    """The fields that differ, each at the outermost path where one side lacks it or has another value."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        changes: dict[str, tuple[Any, Any]] = {}
        for key in base.keys() | overlay.keys():
            pointer = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            changes.update(_changes(base.get(key, ABSENT), overlay.get(key, ABSENT), pointer))
        return changes
    if isinstance(base, list) and isinstance(overlay, list) and len(base) == len(overlay):
        return {k: v for i, (b, o) in enumerate(zip(base, overlay, strict=True))
                for k, v in _changes(b, o, f"{path}/{i}").items()}
    return {} if base == overlay else {path: (base, overlay)}


def test_the_cpu_overlay_changes_exactly_what_it_means_to(trees: dict[str, Fleet]) -> None:
    base, cpu = trees["base"], trees["cpu"]
    assert set(base) - set(cpu) == {("PersistentVolumeClaim", "model-files")} and set(cpu) <= set(base)
    changed = {key: changes for key in cpu if (changes := _changes(base[key], cpu[key]))}
    assert set(changed) == set(CPU_CHANGES)
    for key, expected in CPU_CHANGES.items():
        assert changed[key] == expected, key


def test_the_cpu_overlay_refuses_a_base_whose_args_moved(tmp_path: Path) -> None:
    """The positional patches test their neighbour: a base with a flag more fails the build, naming the
    arg, instead of setting `tiny` on whatever arg came to stand at that index."""
    shutil.copytree(K8S, tmp_path / "k8s")
    engine = tmp_path / "k8s" / "base" / "engine.yaml"
    flag = "            - --headless\n"
    assert engine.read_text().count(flag) == 1
    engine.write_text(engine.read_text().replace(flag, flag + flag.replace("--headless", "--enable-lora")))
    run = kubectl_kustomize(tmp_path / "k8s" / "overlays" / "cpu")
    assert run.returncode != 0
    assert "/spec/template/spec/containers/0/args/3" in run.stderr and "test failed" in run.stderr, run.stderr


# Engines


def _token_secret(container: dict[str, Any]) -> tuple[str, str]:
    """The (Secret, key) a container's ENGINE_AUTH_TOKEN comes from; not optional."""
    (token_env,) = [e for e in container["env"] if e["name"] == "ENGINE_AUTH_TOKEN"]
    ref = token_env["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional", False), "a pod without the token must not start"
    return ref["name"], ref["key"]


def test_engines_and_frontends_take_one_token_from_one_secret(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    engine = _container(resources[("StatefulSet", "engine")])
    frontend = _container(resources[("Deployment", "frontend")])
    assert _token_secret(engine) == _token_secret(frontend) == ("engine-auth-token", "token")
    # Never on the command line, where `ps` shows it.
    assert not {"--auth-token", "--insecure-no-auth-token"} & set(engine["args"] + frontend["args"])


def test_engine_args_parse_and_each_pod_is_its_own_rank_on_the_declared_ports(
        fleet: tuple[str, Fleet], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tree, resources = fleet
    sts = resources[("StatefulSet", "engine")]
    c = _container(sts)
    assert c["command"] == ["python", "-m", "services.engine"]
    (rank_env,) = [e for e in c["env"] if e["name"] == "ENGINE_RANK"]
    assert rank_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    # The engine binds all interfaces: without its Secret's token it refuses to start.
    monkeypatch.delenv("ENGINE_AUTH_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        engine_args(_expand(c["args"], {"ENGINE_RANK": "0"}))
    assert "--host='0.0.0.0' is invalid" in capsys.readouterr().err
    monkeypatch.setenv("ENGINE_AUTH_TOKEN", "from-the-secret")
    for ordinal in range(sts["spec"]["replicas"]):
        config = engine_args(_expand(c["args"], {"ENGINE_RANK": str(ordinal)}))
        assert config.rank == ordinal
        assert config.data_parallel_size_local == 1
        assert (config.port, config.pub_port) == (_ports(sts)["zmq-router"], _ports(sts)["zmq-pub"])
        assert config.host == "0.0.0.0" and config.auth_token == "from-the-secret"
        assert config.model == ("tiny" if tree == "cpu" else "/models/model")
        assert config.backend == "vllm"
        # SIGKILL must not cut the drain short.
        assert _pod(sts)["terminationGracePeriodSeconds"] > config.drain_timeout_s


def test_engine_readiness_is_the_handshake_probe_on_the_router_port(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    sts = resources[("StatefulSet", "engine")]
    c = _container(sts)
    for kind in ("startupProbe", "readinessProbe"):
        assert set(c[kind]) & {"tcpSocket", "httpGet"} == set()  # the ROUTER port is open before the load
        command = c[kind]["exec"]["command"]
        assert command[:3] == ["python", "-m", "services.engine.probe"]
        args = probe.build_parser().parse_args(command[3:])
        assert args.port == _ports(sts)["zmq-router"]
        assert args.timeout < c[kind]["timeoutSeconds"]


def test_engines_get_a_gpu_in_the_base_and_none_in_the_cpu_overlay(fleet: tuple[str, Fleet]) -> None:
    tree, resources = fleet
    sts = resources[("StatefulSet", "engine")]
    pod, c = _pod(sts), _container(sts)
    if tree == "base":
        assert c["image"] == IMAGES["cuda"]
        assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    else:
        assert c["image"] == IMAGES["cpu"]
        assert "nvidia.com/gpu" not in yaml.safe_dump(sts)
        assert "nodeSelector" not in pod and "tolerations" not in pod
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] in {m["name"] for m in c["volumeMounts"]}


# Frontends


def test_frontends_dial_every_engine_by_its_stable_name_and_port(fleet: tuple[str, Fleet]) -> None:
    tree, resources = fleet
    sts, service = resources[("StatefulSet", "engine")], resources[("Service", "engine")]
    assert service["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == service["metadata"]["name"]
    (router_port,) = [p["port"] for p in service["spec"]["ports"] if p["targetPort"] == "zmq-router"]
    frontend = resources[("Deployment", "frontend")]
    c = _container(frontend)
    assert c["command"] == ["python", "-m", "services.frontend"]
    config = frontend_args(c["args"])
    replicas = sts["spec"]["replicas"]
    assert config.data_parallel_size == replicas and config.data_parallel_size_local == 0
    assert config.engine_addresses == tuple(f"tcp://{sts['metadata']['name']}-{i}.{service['metadata']['name']}:"
                                            f"{router_port}" for i in range(replicas))
    assert router_port == _ports(sts)["zmq-router"]
    assert config.host == "0.0.0.0" and config.port == _ports(frontend)["http"]
    assert config.grpc_port == _ports(frontend)["grpc"]
    assert config.model == ("tiny" if tree == "cpu" else "/models/model")
    assert _pod(frontend)["terminationGracePeriodSeconds"] > config.shutdown_timeout_s
    assert c["image"] == IMAGES["slim"]
    assert c["resources"]["requests"]["cpu"]  # the HPA's utilization is relative to the request
    # The kubelet waits for the frontend's handshakes as long as the frontend itself does.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= config.handshake_timeout_s
    assert config.handshake_timeout_s == (300 if tree == "cpu" else 900)


def test_frontend_probes_answer_200_on_the_app(trees: dict[str, Fleet]) -> None:
    frontend = trees["base"][("Deployment", "frontend")]
    c = _container(frontend)
    app = frontend_app()  # one engine handshaken: /ready passes
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[kind]["httpGet"]
        assert _ports(frontend)[get["port"]]
        assert asyncio.run(request(app, "GET", get["path"])).status == 200, kind
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == ("/health", "/ready")


def test_the_autoscaler_and_disruption_budgets_cover_their_workloads(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    frontend = resources[("Deployment", "frontend")]
    hpa = resources[("HorizontalPodAutoscaler", "frontend")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "frontend"}
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    pdb = resources[("PodDisruptionBudget", "frontend")]["spec"]
    assert _selects(pdb["selector"]["matchLabels"], frontend) and pdb["minAvailable"] < hpa["minReplicas"]
    engines = resources[("PodDisruptionBudget", "engine")]["spec"]
    assert _selects(engines["selector"]["matchLabels"], resources[("StatefulSet", "engine")])
    assert engines["maxUnavailable"] < resources[("StatefulSet", "engine")]["spec"]["replicas"]


def test_the_cpu_overlay_needs_no_shared_checkpoint_volume(trees: dict[str, Fleet]) -> None:
    cpu = trees["cpu"]
    assert ("PersistentVolumeClaim", "model-files") not in cpu
    assert "persistentVolumeClaim" not in yaml.safe_dump(_pod(cpu[("Deployment", "frontend")]))
    base = trees["base"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in _pod(base[("Deployment", "frontend")])["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["model-files"] and ("PersistentVolumeClaim", "model-files") in base


# Router


def _router_config(resources: Fleet) -> tuple[Any, Any]:
    router = resources[("Deployment", "router")]
    c = _container(router)
    assert c["command"] == ["python", "-m", "services.router"]
    args = router_parser().parse_args(c["args"])
    (mount,) = [m for m in c["volumeMounts"] if str(args.config).startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in _pod(router)["volumes"] if v["name"] == mount["name"]]
    config_map = resources[("ConfigMap", volume["configMap"]["name"])]
    text = config_map["data"][str(args.config)[len(mount["mountPath"]) + 1:]]
    return args, parse_config(yaml.safe_load(text), "router-config", env={})


def test_the_router_config_map_validates_and_points_at_the_frontend_service(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    args, config = _router_config(resources)
    assert args.port is None  # the listeners' ports are the config's
    assert _pod(resources[("Deployment", "router")])["terminationGracePeriodSeconds"] > args.shutdown_timeout
    frontend, service = resources[("Deployment", "frontend")], resources[("Service", "frontend")]
    assert service["spec"]["clusterIP"] == "None"  # the DNS name resolves to each frontend pod
    served = frontend_args(_container(frontend)["args"])
    for pool in config.pools.values():
        assert pool.dns is not None and pool.dns.name == service["metadata"]["name"]
        assert pool.dns.port == service["spec"]["ports"][0]["port"] == served.port
        assert pool.model == served.served_model_name
        assert pool.health.path == "/ready"
    router = resources[("Deployment", "router")]
    assert sorted(listener.port for listener in config.listeners) == sorted(_ports(router).values())
    assert all(listener.host == "0.0.0.0" for listener in config.listeners)


def test_router_probes_answer_200_on_the_app_without_an_api_key(trees: dict[str, Fleet]) -> None:
    resources = trees["base"]
    _, config = _router_config(resources)
    router = resources[("Deployment", "router")]
    c = _container(router)
    routing = Router(config)
    pools = build_pools(config)
    app = RouterApp(config, routing, pools, FakeUpstream(), RouterMetrics(pools))
    for kind in ("livenessProbe", "readinessProbe"):
        get = c[kind]["httpGet"]
        assert asyncio.run(request(app, "GET", get["path"], port=_ports(router)[get["port"]])).status == 200, kind
    # The metrics port serves /metrics to a scraper that has no key.
    metrics = _ports(router)["metrics"]
    assert asyncio.run(request(app, "GET", "/metrics", port=metrics)).status == 200


# Services and NetworkPolicies


def test_each_service_selects_one_workload_and_targets_its_named_ports(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    for (kind, name), service in resources.items():
        if kind != "Service":
            continue
        labels = service["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "fleet" and labels["app.kubernetes.io/component"] == name
        (workload,) = [w for w in _workloads(resources) if _selects(service["spec"]["selector"], w)]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] == port["name"] and port["name"] in _ports(workload), (name, port)
    # ServiceMonitor-ready: the ports that serve /metrics are named for it (the frontend's gRPC port serves none).
    assert {p["name"] for p in resources[("Service", "frontend")]["spec"]["ports"]} == {"http", "grpc"}
    assert {p["name"] for p in resources[("Service", "router")]["spec"]["ports"]} == {"http", "metrics"}


def test_network_policies_let_only_frontends_reach_engines_and_only_the_router_reach_frontends(
        fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    engine, frontend, router = (resources[("StatefulSet", "engine")], resources[("Deployment", "frontend")],
                                resources[("Deployment", "router")])
    for name, target, source in (("engine-from-frontend", engine, frontend), ("frontend-from-router", frontend,
                                                                              router)):
        spec = resources[("NetworkPolicy", name)]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        selected = [w for w in _workloads(resources) if _selects(spec["podSelector"]["matchLabels"], w)]
        assert selected == [target]
        (rule,) = spec["ingress"]
        (peer,) = rule["from"]
        assert [w for w in _workloads(resources) if _selects(peer["podSelector"]["matchLabels"], w)] == [source]
        assert sorted(p["port"] for p in rule["ports"]) == sorted(_ports(target).values())


def test_the_ingress_routes_to_the_routers_public_port(trees: dict[str, Fleet],
                                                       optional: list[tuple[str, Resource]]) -> None:
    ((_, ingress),) = [(n, d) for n, d in optional if d["kind"] == "Ingress"]
    router = trees["base"][("Service", "router")]
    backends = [path["backend"]["service"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]]
    assert backends == [{"name": router["metadata"]["name"], "port": {"name": "http"}}]
    assert "http" in {p["name"] for p in router["spec"]["ports"]}
    assert {h for t in ingress["spec"]["tls"] for h in t["hosts"]} == {r["host"] for r in ingress["spec"]["rules"]}


def test_every_pod_runs_as_non_root_and_drops_capabilities(fleet: tuple[str, Fleet]) -> None:
    _, resources = fleet
    for workload in _workloads(resources):
        assert _pod(workload)["securityContext"]["runAsNonRoot"] is True
        c = _container(workload)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["image"] in IMAGES.values()
