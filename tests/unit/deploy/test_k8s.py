"""deploy/k8s: every manifest (the base, the cpu overlay rendered, the optional Ingress) validates
against the Kubernetes 1.30 schemas offline, and what the schemas cannot see holds: container args
parse with the services' own CLI parsers, Services, probes and NetworkPolicies point at real ports
and pods, the frontends dial the StatefulSet's stable names, and the router's ConfigMap passes its
config validation."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

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
from tests.support.kustomize import Resource, Unsupported, apply_json6902, build, load_documents

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
K8S_VERSION = "1.30"
TREES = {"base": K8S / "base", "cpu": K8S / "overlays" / "cpu"}
IMAGES = {"slim": "ghcr.io/fleet/fleet-slim:0.1.0", "cuda": "ghcr.io/fleet/fleet-engine-cuda:0.1.0",
          "cpu": "ghcr.io/fleet/fleet-engine-cpu:0.1.0"}


def _rendered(tree: str) -> dict[tuple[str, str], Resource]:
    resources = build(TREES[tree])
    by_key = {(r["kind"], r["metadata"]["name"]): r for r in resources}
    assert len(by_key) == len(resources), "two resources share a kind and name"
    return by_key


@pytest.fixture(scope="module", params=sorted(TREES))
def fleet(request: pytest.FixtureRequest) -> tuple[str, dict[tuple[str, str], Resource]]:
    return request.param, _rendered(request.param)


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


def _workloads(fleet: dict[tuple[str, str], Resource]) -> list[Resource]:
    return [r for (kind, _), r in fleet.items() if kind in ("Deployment", "StatefulSet")]


# Schemas


def _documents() -> list[tuple[str, Resource]]:
    docs = [(f"{tree}: {r['kind']}/{r['metadata']['name']}", r) for tree in TREES for r in build(TREES[tree])]
    docs += [(f"optional: {r['kind']}/{r['metadata']['name']}", r)
             for path in sorted((K8S / "optional").glob("*.yaml")) for r in load_documents(path)]
    return docs


@pytest.mark.parametrize(("name", "doc"), _documents(), ids=[n for n, _ in _documents()])
def test_each_manifest_validates_against_the_kubernetes_schemas(name: str, doc: Resource) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises, naming the field


def test_a_misspelt_field_fails_validation() -> None:
    deployment = dict(_rendered("base")[("Deployment", "frontend")])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# The renderer


def test_renderer_applies_json6902_and_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    doc = {"a": {"b": [1, 2], "c": 3}}
    assert apply_json6902(doc, [{"op": "replace", "path": "/a/b/1", "value": 9}, {"op": "remove", "path": "/a/c"},
                                {"op": "add", "path": "/a/b/-", "value": 4}, {"op": "add", "path": "/a/d~1e",
                                                                              "value": 5}]) == \
        {"a": {"b": [1, 9, 4], "d/e": 5}}
    with pytest.raises(KeyError):
        apply_json6902(doc, [{"op": "remove", "path": "/a/missing"}])
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [], "patches": [{"target": {"kind": "X"}, "patch": "spec: {replicas: 3}"}]}))
    with pytest.raises(Unsupported):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"images": [{"name": "x"}]}))
    with pytest.raises(Unsupported):
        build(tmp_path)


# Engines


def _token_secret(container: dict[str, Any]) -> tuple[str, str]:
    """The (Secret, key) a container's ENGINE_AUTH_TOKEN comes from; not optional."""
    (token_env,) = [e for e in container["env"] if e["name"] == "ENGINE_AUTH_TOKEN"]
    ref = token_env["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional", False), "a pod without the token must not start"
    return ref["name"], ref["key"]


def test_engines_and_frontends_take_one_token_from_one_secret(fleet: Any) -> None:
    _, resources = fleet
    engine = _container(resources[("StatefulSet", "engine")])
    frontend = _container(resources[("Deployment", "frontend")])
    assert _token_secret(engine) == _token_secret(frontend) == ("engine-auth-token", "token")
    # Never on the command line, where `ps` shows it.
    assert not {"--auth-token", "--insecure-no-auth-token"} & set(engine["args"] + frontend["args"])


def test_engine_args_parse_and_each_pod_is_its_own_rank_on_the_declared_ports(
        fleet: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
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


def test_engine_readiness_is_the_handshake_probe_on_the_router_port(fleet: Any) -> None:
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


def test_engines_get_a_gpu_in_the_base_and_none_in_the_cpu_overlay(fleet: Any) -> None:
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


def test_frontends_dial_every_engine_by_its_stable_name_and_port(fleet: Any) -> None:
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


def test_frontend_probes_answer_200_on_the_app() -> None:
    frontend = _rendered("base")[("Deployment", "frontend")]
    c = _container(frontend)
    app = frontend_app()  # one engine handshaken: /ready passes
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[kind]["httpGet"]
        assert _ports(frontend)[get["port"]]
        assert asyncio.run(request(app, "GET", get["path"])).status == 200, kind
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == ("/health", "/ready")


def test_the_autoscaler_and_disruption_budgets_cover_their_workloads(fleet: Any) -> None:
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


def test_the_cpu_overlay_needs_no_shared_checkpoint_volume() -> None:
    cpu = _rendered("cpu")
    assert ("PersistentVolumeClaim", "model-files") not in cpu
    assert "persistentVolumeClaim" not in yaml.safe_dump(_pod(cpu[("Deployment", "frontend")]))
    base = _rendered("base")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in _pod(base[("Deployment", "frontend")])["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["model-files"] and ("PersistentVolumeClaim", "model-files") in base


# Router


def _router_config(resources: dict[tuple[str, str], Resource]) -> tuple[Any, Any]:
    router = resources[("Deployment", "router")]
    c = _container(router)
    assert c["command"] == ["python", "-m", "services.router"]
    args = router_parser().parse_args(c["args"])
    (mount,) = [m for m in c["volumeMounts"] if str(args.config).startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in _pod(router)["volumes"] if v["name"] == mount["name"]]
    config_map = resources[("ConfigMap", volume["configMap"]["name"])]
    text = config_map["data"][str(args.config)[len(mount["mountPath"]) + 1:]]
    return args, parse_config(yaml.safe_load(text), "router-config", env={})


def test_the_router_config_map_validates_and_points_at_the_frontend_service(fleet: Any) -> None:
    _, resources = fleet
    args, config = _router_config(resources)
    assert args.port is None  # the listeners' ports are the config's
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


def test_router_probes_answer_200_on_the_app_without_an_api_key() -> None:
    resources = _rendered("base")
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


def test_each_service_selects_one_workload_and_targets_its_named_ports(fleet: Any) -> None:
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


def test_network_policies_let_only_frontends_reach_engines_and_only_the_router_reach_frontends(fleet: Any) -> None:
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


def test_every_pod_runs_as_non_root_and_drops_capabilities(fleet: Any) -> None:
    _, resources = fleet
    for workload in _workloads(resources):
        assert _pod(workload)["securityContext"]["runAsNonRoot"] is True
        c = _container(workload)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["image"] in IMAGES.values()
