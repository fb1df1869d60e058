"""deploy/k8s against the Kubernetes JSON schemas (strict: unknown fields are errors), and its wiring:
a headless Service per gRPC service, gRPC probes on the right ports and health names, resource
requests, the HorizontalPodAutoscaler for embed, the edge's targets, and the model configuration."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from launcher.cli import build_parser
from services.common.server import LIVENESS
from tritongate import registry
from tritongate.settings import DEPLOY_DIR, Settings

K8S = DEPLOY_DIR / "k8s"
SERVICES = registry.NAMES
DEFAULTS = Settings()
# grpc probes are GA from 1.27; check that release and the newest the schemas cover.
VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]


def tritongate_args(args: list[str]) -> Any:
    """A container's args as the image's `tritongate` entry point parses them."""
    return build_parser().parse_args(args)


def manifests() -> list[Path]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [K8S / name for name in kustomization["resources"]]


@cache
def resources() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, key
            found[key] = doc
    return found


def get(kind: str, name: str) -> dict[str, Any]:
    return resources()[(kind, name)]


def container(name: str) -> dict[str, Any]:
    spec = get("Deployment", name)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def env(name: str) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(name).get("env", [])}


def test_kustomization_lists_every_manifest() -> None:
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(p.name for p in manifests()) == files


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    kinds = set()
    for (kind, name), doc in resources().items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kind}/{name} on Kubernetes {version}: {exc.message} at {list(exc.path)}")
        kinds.add((doc["apiVersion"], kind))
    assert {("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
            ("autoscaling/v2", "HorizontalPodAutoscaler")} <= kinds


def test_the_schema_check_catches_broken_manifests() -> None:
    deployment = json.loads(json.dumps(get("Deployment", "embed")))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grpc"]["port"] = "grpc"  # must be a number
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    hpa = json.loads(json.dumps(get("HorizontalPodAutoscaler", "embed")))
    hpa["spec"]["targetCPUUtilizationPercentage"] = 70  # autoscaling/v1's field, unknown in v2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, VERSIONS[0], strict=True)


def test_each_grpc_service_is_headless_with_grpc_probes() -> None:
    for name in SERVICES:
        port = DEFAULTS.port(name)
        service, deployment = get("Service", name), get("Deployment", name)
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        assert deployment["spec"]["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
        grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc_port["port"] == port and grpc_port["appProtocol"] == "grpc"
        c = container(name)
        assert tritongate_args(c["args"]).command == name
        assert {"name": "grpc", "containerPort": port} in c["ports"]
        assert c["readinessProbe"]["grpc"] == {"port": port}  # "": follows Triton's readiness
        assert c["livenessProbe"]["grpc"] == {"port": port, "service": LIVENESS}
        assert env(name)["TRITONGATE_SERVICE_HOST"] == "0.0.0.0"
        assert f"TRITONGATE_{name.upper()}_PORT" not in env(name)
        metrics = int(env(name)["TRITONGATE_METRICS_PORT"])
        assert {"name": "metrics", "containerPort": metrics} in c["ports"]
        spec = deployment["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] >= float(env(name)["TRITONGATE_SHUTDOWN_GRACE_S"]) + 5
        assert spec["securityContext"]["runAsNonRoot"] is True


def test_every_container_requests_cpu_and_memory() -> None:
    for (kind, name), doc in resources().items():
        if kind != "Deployment":
            continue
        spec = doc["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), f"{name}/{c['name']}"
            assert "memory" in c["resources"]["limits"], f"{name}/{c['name']}"


def test_embed_scales_horizontally_on_cpu() -> None:
    hpa = get("HorizontalPodAutoscaler", "embed")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "embed"}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert "cpu" in container("embed")["resources"]["requests"]  # utilization is relative to it


def test_edge_is_a_normal_service_reaching_the_headless_services() -> None:
    service = get("Service", "edge")["spec"]
    assert service.get("clusterIP") != "None" and service["ports"][0]["port"] == DEFAULTS.edge_port
    c = container("edge")
    assert tritongate_args(c["args"]).command == "edge"
    assert {"name": "http", "containerPort": DEFAULTS.edge_port} in c["ports"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    for name in SERVICES:
        match = re.fullmatch(r"dns:///([\w-]+):(\d+)", env("edge")[f"TRITONGATE_{name.upper()}_TARGET"])
        assert match and get("Service", match[1])["spec"]["clusterIP"] == "None"
        assert int(match[2]) == DEFAULTS.port(name)
    grace = float(env("edge")["TRITONGATE_SHUTDOWN_GRACE_S"])
    assert grace >= max(float(env(name)["TRITONGATE_SHUTDOWN_GRACE_S"]) for name in SERVICES)


def test_services_read_the_model_config_map() -> None:
    config_map = get("ConfigMap", "tritongate-model-config")
    compose_config = json.loads((DEPLOY_DIR / "model_config.compose.json").read_text())
    assert json.loads(config_map["data"]["model_config.json"]) == compose_config  # the same demo on `triton`
    triton_ports = {p["port"] for p in get("Service", "triton")["spec"]["ports"]}
    for section in (info.section for info in registry.SERVICES):
        for entry in compose_config[section]:
            host, port = entry["url"].split(":")
            assert host == "triton" and int(port) in triton_ports
    for name in SERVICES:
        spec = get("Deployment", name)["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if "configMap" in v)
        assert volume["configMap"]["name"] == "tritongate-model-config"
        mount = next(m for m in container(name)["volumeMounts"] if m["name"] == volume["name"])
        assert env(name)["TRITONGATE_CONFIG_FILE"] == f"{mount['mountPath']}/model_config.json"
        init = spec["initContainers"][0]
        assert tritongate_args(init["args"]).models_command == "fetch"
        mounts = {m["mountPath"]: m["name"] for m in container(name)["volumeMounts"]}
        assert mounts[env(name)["TRITONGATE_MODELS_DIR"]] == init["volumeMounts"][0]["name"]


def test_the_edge_scales_in_pods_of_one_process_on_cpu() -> None:
    hpa = get("HorizontalPodAutoscaler", "edge")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "edge"}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"] and hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert env("edge")["TRITONGATE_EDGE_WORKERS"] == "1"
    assert Settings(edge_workers=env("edge")["TRITONGATE_EDGE_WORKERS"]).edge_workers == 1  # type: ignore[arg-type]
