"""deploy/k8s: the base and every overlay as `kubectl kustomize` renders them, each object against the
Kubernetes JSON schemas (strict: unknown fields are errors) where Kubernetes defines its kind, and the
wiring read off the objects: a headless Service wherever a component balances over pods itself, gRPC
probes, resource requests, disruption budgets and topology spread, the Valkey the edges share, and an
autoscaler metric that some recording rule and adapter provide."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from launcher.cli import build_parser
from services.common.server import LIVENESS
from tritongate import registry
from tritongate.config import ModelConfig, parse_model_config
from tritongate.settings import DEPLOY_DIR, Settings

K8S = DEPLOY_DIR / "k8s"
BASE = K8S / "base"
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
SERVICES = registry.NAMES
DEFAULTS = Settings()
# grpc probes are GA from 1.27; check that release and the newest the schemas cover.
VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# Kinds that the operators the overlays build on define (Kubernetes' schemas do not know them): their
# fields are checked by the tests below that read them.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
                ("keda.sh/v1alpha1", "ScaledObject"), ("gateway.networking.k8s.io/v1", "HTTPRoute"),
                ("serving.kserve.io/v1beta1", "InferenceService")}
# The services' and the edge's images run as this user and group (the Dockerfile's tritongate user).
TRITONGATE_IDS = 10001


def tritongate_args(args: list[str]) -> Any:
    """A container's args as the image's `tritongate` entry point parses them."""
    return build_parser().parse_args(args)


@cache
def render(directory: Path) -> tuple[dict[str, Any], ...]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (its `kubectl kustomize` renders the overlays)")
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects(directory: Path = BASE) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in render(directory):
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in found, key
        found[key] = doc
    return found


def get(kind: str, name: str, directory: Path = BASE) -> dict[str, Any]:
    return objects(directory)[(kind, name)]


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def container(name: str) -> dict[str, Any]:
    """The base's container `name`, in the Deployment of the same name."""
    return next(c for c in pod_spec(get("Deployment", name))["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in c.get("env", []) if "value" in item}


def env(name: str) -> dict[str, str]:
    return env_of(container(name))


def tritongate_containers(directory: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(Deployment, container) for every container that runs a tritongate component."""
    return [(doc, c) for doc in render(directory) if doc["kind"] == "Deployment"
            for c in pod_spec(doc)["containers"] if c["image"].split(":")[0].endswith("tritongate")]


def model_configs(deployment: dict[str, Any], directory: Path) -> list[ModelConfig]:
    """The model configurations the deployment's pods mount (from ConfigMaps), as the services read them."""
    names = [v["configMap"]["name"] for v in pod_spec(deployment).get("volumes", []) if "configMap" in v]
    return [parse_model_config(json.loads(get("ConfigMap", name, directory)["data"]["model_config.json"]), name)
            for name in names]


def test_the_base_lists_every_manifest_beside_it() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in BASE.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")
    assert {p.name for p in OVERLAYS} == {"triton-autoscale", "triton-keda", "inference-pool", "kserve"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_every_object_validates_against_the_kubernetes_schemas(directory: Path, version: str) -> None:
    kinds = set()
    for doc in render(directory):
        kind = (doc["apiVersion"], doc["kind"])
        kinds.add(kind)
        if kind in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: {exc.message} at "
                        f"{list(exc.path)}")
    assert {("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"), ("policy/v1", "PodDisruptionBudget"),
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


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_every_service_a_component_balances_over_itself_is_headless(directory: Path) -> None:
    """The edge's targets and the services' Triton addresses: a `dns:///` name must be a headless Service
    (so that DNS lists every ready pod and the client spreads its calls over them) with that port; any
    other address is the pod's own sidecar (loopback). A ClusterIP Service would pin each long-lived
    gRPC connection to one pod."""
    found = objects(directory)
    checked = []
    for deployment, c in tritongate_containers(directory):
        addresses = [value for name, value in env_of(c).items() if re.fullmatch(r"TRITONGATE_\w+_TARGET", name)]
        if tritongate_args(c["args"]).command in SERVICES:
            addresses += [str(address) for config in model_configs(deployment, directory)
                          for info in registry.SERVICES for entry in getattr(config, info.section)
                          for address in entry.triton_addresses]
        for address in addresses:
            if address.startswith("127.0.0.1:"):
                continue
            match = re.fullmatch(r"dns:///([\w-]+):(\d+)", address)
            assert match, f"{deployment['metadata']['name']}/{c['name']}: {address} is neither dns:/// nor loopback"
            service = found[("Service", match[1])]["spec"]
            assert service.get("clusterIP") == "None", f"{address}: Service {match[1]} is not headless"
            assert int(match[2]) in {p["port"] for p in service["ports"]}, address
            checked.append(match[1])
    assert {"triton", *SERVICES} <= set(checked)


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
        spec = pod_spec(deployment)
        assert spec["terminationGracePeriodSeconds"] >= float(env(name)["TRITONGATE_SHUTDOWN_GRACE_S"]) + 5
        assert spec["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_every_container_requests_cpu_and_memory_and_tritongate_runs_as_its_image_user(directory: Path) -> None:
    for doc in render(directory):
        if doc["kind"] != "Deployment":
            continue
        spec = pod_spec(doc)
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), f"{doc['metadata']['name']}/{c['name']}"
            assert "memory" in c["resources"]["limits"], f"{doc['metadata']['name']}/{c['name']}"
    for deployment, c in tritongate_containers(directory):
        context = {**pod_spec(deployment).get("securityContext", {}), **c.get("securityContext", {})}
        assert context["runAsUser"] == context["runAsGroup"] == TRITONGATE_IDS, deployment["metadata"]["name"]


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_every_deployment_spreads_its_pods_and_has_a_disruption_budget(directory: Path) -> None:
    budgets = [doc for doc in render(directory) if doc["kind"] == "PodDisruptionBudget"]
    for doc in render(directory):
        if doc["kind"] != "Deployment" or doc["metadata"]["name"] == "valkey":  # one in-memory store
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        spread = pod_spec(doc)["topologySpreadConstraints"]
        assert {s["topologyKey"] for s in spread} >= {"kubernetes.io/hostname"}, doc["metadata"]["name"]
        assert all(s["labelSelector"]["matchLabels"].items() <= labels.items() for s in spread)
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1 and covering[0]["spec"]["maxUnavailable"] == 1, doc["metadata"]["name"]


def test_the_edges_share_one_valkey_that_keeps_nothing_on_disk() -> None:
    url = env("edge")["TRITONGATE_STATE_URL"]
    host, port = re.fullmatch(r"redis://([\w-]+):(\d+)/\d+", url).groups()  # type: ignore[union-attr]
    service, deployment = get("Service", host), get("Deployment", host)
    assert service["spec"].get("type") == "ClusterIP" and int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] == 1
    (valkey,) = pod_spec(deployment)["containers"]
    assert valkey["image"].startswith("valkey/valkey:")
    args = valkey["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"
    # Full, it refuses writes (the edge's 503) instead of evicting stored Responses or the store's own keys.
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert "volumes" not in pod_spec(deployment) and "volumeMounts" not in valkey
    for _, c in tritongate_containers(K8S / "overlays" / "inference-pool"):
        if tritongate_args(c["args"]).command == "edge":
            assert env_of(c)["TRITONGATE_STATE_URL"] == url  # the pool's edges share it too


def test_the_edge_is_a_normal_service_that_scales_in_pods_of_one_process_on_cpu() -> None:
    service = get("Service", "edge")["spec"]
    assert service.get("clusterIP") != "None" and service["ports"][0]["port"] == DEFAULTS.edge_port
    c = container("edge")
    assert tritongate_args(c["args"]).command == "edge"
    assert {"name": "http", "containerPort": DEFAULTS.edge_port} in c["ports"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    grace = float(env("edge")["TRITONGATE_SHUTDOWN_GRACE_S"])
    assert grace >= max(float(env(name)["TRITONGATE_SHUTDOWN_GRACE_S"]) for name in SERVICES)
    hpa = get("HorizontalPodAutoscaler", "edge")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "edge"}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"] and hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert env("edge")["TRITONGATE_EDGE_WORKERS"] == "1"
    assert Settings(edge_workers=env("edge")["TRITONGATE_EDGE_WORKERS"]).edge_workers == 1


def test_services_read_the_demo_model_config_with_triton_as_a_dns_name() -> None:
    compose_config = json.loads((DEPLOY_DIR / "model_config.compose.json").read_text())
    ours = json.loads(get("ConfigMap", "tritongate-model-config")["data"]["model_config.json"])
    for section in (info.section for info in registry.SERVICES):
        for entry in ours[section]:
            assert entry.pop("grpc_url") == "dns:///triton:8001"
    assert ours == compose_config  # otherwise the same demo as compose
    for name in SERVICES:
        spec = pod_spec(get("Deployment", name))
        volume = next(v for v in spec["volumes"] if "configMap" in v)
        assert volume["configMap"]["name"] == "tritongate-model-config"
        mount = next(m for m in container(name)["volumeMounts"] if m["name"] == volume["name"])
        assert env(name)["TRITONGATE_CONFIG_FILE"] == f"{mount['mountPath']}/model_config.json"
        init = spec["initContainers"][0]
        assert tritongate_args(init["args"]).models_command == "fetch"
        mounts = {m["mountPath"]: m["name"] for m in container(name)["volumeMounts"]}
        assert mounts[env(name)["TRITONGATE_MODELS_DIR"]] == init["volumeMounts"][0]["name"]


def recorded_series(directory: Path) -> dict[str, str]:
    """Series recorded by the PrometheusRules of a rendering: name -> expression."""
    return {rule["record"]: " ".join(rule["expr"].split()) for doc in render(directory)
            if doc["kind"] == "PrometheusRule" for group in doc["spec"]["groups"] for rule in group["rules"]
            if "record" in rule}


def adapter_metrics(directory: Path) -> dict[str, str]:
    """Metrics the overlay's prometheus-adapter values serve: name -> the series it reads."""
    values = directory / "prometheus-adapter-values.yaml"
    if not values.exists():
        return {}
    rules = yaml.safe_load(values.read_text())["rules"]["custom"]
    return {rule["name"]["as"]: re.match(r"[\w:]+", rule["seriesQuery"])[0] for rule in rules}  # type: ignore[index]


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_every_autoscaler_names_a_metric_that_a_rule_or_adapter_provides(directory: Path) -> None:
    """Resource metrics come from the metrics server; a pods metric from the prometheus-adapter, which
    reads a series a PrometheusRule records; a KEDA trigger queries such a series itself."""
    found, recorded, served = objects(directory), recorded_series(directory), adapter_metrics(directory)
    assert set(served.values()) <= set(recorded)
    for doc in render(directory):
        if doc["kind"] == "HorizontalPodAutoscaler":
            target = doc["spec"]["scaleTargetRef"]
            for metric in doc["spec"]["metrics"]:
                if metric["type"] == "Resource":
                    assert metric["resource"]["name"] in ("cpu", "memory")
                    continue
                assert metric["type"] == "Pods", metric
                assert metric["pods"]["metric"]["name"] in served, metric
        elif doc["kind"] == "ScaledObject":
            target = {"kind": "Deployment", **doc["spec"]["scaleTargetRef"]}
            for trigger in doc["spec"]["triggers"]:
                assert trigger["type"] == "prometheus"
                assert set(re.findall(r"[\w:]+:[\w:]+", trigger["metadata"]["query"])) <= set(recorded), trigger
        else:
            continue
        assert (target["kind"], target["name"]) in found, target


def test_triton_scales_on_nvidias_queue_to_compute_ratio() -> None:
    for name in ("triton-autoscale", "triton-keda"):
        (expr,) = recorded_series(K8S / "overlays" / name).values()
        queue = r"rate\(nv_inference_queue_duration_us(\{[^}]*\})?\[1m\]\)"
        compute = r"clamp_min\(rate\(nv_inference_compute_infer_duration_us(\{[^}]*\})?\[1m\]\), 1\)"
        assert re.search(rf"{queue} / {compute}", expr), expr
        assert "by (namespace, pod)" in expr  # one value per pod, as a pods metric needs
        monitor = get("PodMonitor", "triton", K8S / "overlays" / name)["spec"]
        triton = get("Deployment", "triton")["spec"]["template"]
        assert monitor["selector"]["matchLabels"].items() <= triton["metadata"]["labels"].items()
        ports = {p["name"]: p["containerPort"] for c in triton["spec"]["containers"] for p in c["ports"]}
        assert ports[monitor["podMetricsEndpoints"][0]["port"]] == 8002  # Triton's metrics port
    assert get("HorizontalPodAutoscaler", "triton", K8S / "overlays" / "triton-autoscale")["spec"]["minReplicas"] >= 1
    assert ("HorizontalPodAutoscaler", "triton") not in objects(K8S / "overlays" / "triton-keda")  # KEDA makes it


def test_kedas_query_keeps_to_the_namespace_the_overlay_deploys_into() -> None:
    overlay = K8S / "overlays" / "triton-keda"
    namespaces = {doc["metadata"].get("namespace") for doc in render(overlay)}
    (scaled,) = [doc for doc in render(overlay) if doc["kind"] == "ScaledObject"]
    for trigger in scaled["spec"]["triggers"]:
        assert re.findall(r'namespace="([^"]*)"', trigger["metadata"]["query"]) == list(namespaces), namespaces


def test_the_inference_pool_routes_to_triton_pods_that_carry_tritongate() -> None:
    overlay = K8S / "overlays" / "inference-pool"
    values = yaml.safe_load((overlay / "inferencepool-values.yaml").read_text())
    pool = values["inferencePool"]
    assert pool["modelServerType"] == "triton-tensorrt-llm"
    release = re.search(r"helm install ([\w-]+) \S+/inferencepool", (overlay / "kustomization.yaml").read_text())[1]  # type: ignore[index]
    pods = get("Deployment", "triton-pool", overlay)["spec"]["template"]
    assert pool["modelServers"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    containers = {c["name"]: c for c in pods["spec"]["containers"]}
    assert {"triton", "llm", "edge"} <= set(containers)
    assert tritongate_args(containers["edge"]["args"]).command == "edge"
    assert pool["targetPorts"] == [{"number": DEFAULTS.edge_port}]
    assert {"name": "http", "containerPort": DEFAULTS.edge_port} in containers["edge"]["ports"]
    metrics_port = int(values["inferenceExtension"]["flags"]["model-server-metrics-port"])
    assert {"name": "metrics", "containerPort": metrics_port} in containers["triton"]["ports"]
    assert env_of(containers["edge"])["TRITONGATE_LLM_TARGET"] == f"127.0.0.1:{DEFAULTS.port('llm')}"
    (config,) = model_configs(get("Deployment", "triton-pool", overlay), overlay)
    assert [str(a) for e in config.llm for a in e.triton_addresses] == ["127.0.0.1:8001"]  # the pod's own Triton
    (rule,) = get("HTTPRoute", "tritongate-llm", overlay)["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": release,
                       "port": DEFAULTS.edge_port}


def test_kserve_serves_triton_behind_the_same_headless_name() -> None:
    overlay = K8S / "overlays" / "kserve"
    found = objects(overlay)
    assert ("Deployment", "triton") not in found and ("PodDisruptionBudget", "triton") not in found
    isvc = get("InferenceService", "triton", overlay)
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "triton" and model["protocolVersion"] == "grpc-v2"
    service = get("Service", "triton", overlay)["spec"]
    assert service["selector"] == {"serving.kserve.io/inferenceservice": isvc["metadata"]["name"],
                                   "component": "predictor"}
    (grpc_port,) = {p["containerPort"] for p in model["ports"]}
    assert {p["port"] for p in service["ports"]} == {grpc_port}
    config = json.loads(get("ConfigMap", "tritongate-model-config", overlay)["data"]["model_config.json"])
    base = json.loads(get("ConfigMap", "tritongate-model-config")["data"]["model_config.json"])
    for section in (info.section for info in registry.SERVICES):
        for ours, theirs in zip(config[section], base[section], strict=True):
            assert ours.pop("grpc_url") == f"dns:///triton:{grpc_port}"
            theirs.pop("grpc_url")
            assert ours == theirs  # the same models as the base
