"""deploy/k8s/optional/servicemonitor.yaml: each ServiceMonitor selects exactly one Service of the base
by its labels and scrapes a port that Service names, on a container port that serves /metrics; the
NetworkPolicy beside them opens that port on the frontends, whose base policy admits only the router."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
MONITORS = K8S / "optional" / "servicemonitor.yaml"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base(kind: str) -> list[dict[str, Any]]:
    return [d for path in sorted((K8S / "base").glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in _documents(path) if d["kind"] == kind]


def _service(name: str) -> dict[str, Any]:
    [service] = [s for s in _base("Service") if s["metadata"]["name"] == name]
    return service


def _monitors() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _documents(MONITORS) if d["kind"] == "ServiceMonitor"}


def _selected(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_each_monitor_selects_one_service_on_a_named_port_that_serves_metrics() -> None:
    monitors = _monitors()
    assert sorted(monitors) == ["frontend", "router"]  # the engines speak no HTTP
    services = _base("Service")
    deployments = {d["metadata"]["name"]: d for d in _base("Deployment")}
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [s["metadata"]["name"] for s in services if _selected(selector, s["metadata"]["labels"])]
        assert matched == [name], f"ServiceMonitor {name} selects Services {matched}"
        [service] = [s for s in services if s["metadata"]["name"] == name]
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["port"] in ports, f"ServiceMonitor {name}: port {endpoint['port']!r} not in {sorted(ports)}"
        assert endpoint["path"] == "/metrics"
        # The Service's targetPort names a container port of the Deployment whose pods it selects.
        [container] = deployments[name]["spec"]["template"]["spec"]["containers"]
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[endpoint["port"]]["targetPort"] in container_ports


def test_the_router_monitor_scrapes_the_ops_listener_which_takes_no_key() -> None:
    """/metrics needs the listener's key where it has keys: Prometheus sends none, so the ops one."""
    [config_map] = [c for c in _base("ConfigMap") if c["metadata"]["name"] == "router-config"]
    listeners = {lst["port"]: lst for lst in yaml.safe_load(config_map["data"]["router.yaml"])["listeners"]}
    [service] = [s for s in _base("Service") if s["metadata"]["name"] == "router"]
    [endpoint] = _monitors()["router"]["spec"]["endpoints"]
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}[endpoint["port"]]
    ops = listeners[port]
    assert not ops.get("api_keys") and "api_keys_env" not in ops, ops


def test_prometheus_may_reach_the_frontends_metrics_port() -> None:
    [policy] = [d for d in _documents(MONITORS) if d["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, "1.30", strict=True)
    [frontend] = [d for d in _base("Deployment") if d["metadata"]["name"] == "frontend"]
    pod_labels = frontend["spec"]["template"]["metadata"]["labels"]
    assert _selected(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    [container] = frontend["spec"]["template"]["spec"]["containers"]
    [endpoint] = _monitors()["frontend"]["spec"]["endpoints"]
    service_port = {p["name"]: p for p in _service("frontend")["spec"]["ports"]}[endpoint["port"]]
    http = {p["name"]: p["containerPort"] for p in container["ports"]}[service_port["targetPort"]]
    [rule] = policy["spec"]["ingress"]
    assert {"protocol": "TCP", "port": http} in rule["ports"]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_monitors_scrape_as_often_as_the_compose_config() -> None:
    """The dashboards' $__rate_interval follows the data source's scrape interval: one value for both
    ways of deploying, and the operator's duration format (the CRD's pattern)."""
    shipped = yaml.safe_load((K8S.parent / "observability" / "prometheus.yml").read_text())
    for name, monitor in _monitors().items():
        for endpoint in monitor["spec"]["endpoints"]:
            assert re.fullmatch(r"(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
                                r"(([0-9]+)ms)?)", endpoint["interval"]), name
            assert endpoint["interval"] == shipped["global"]["scrape_interval"], name
            assert endpoint["scrapeTimeout"] == shipped["global"]["scrape_timeout"], name
