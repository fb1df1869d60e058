"""deploy/compose.yaml (and its override files) against the Compose Specification JSON schema, and its
wiring against the code: the services the edge targets, ports, health checks, commands, start order,
shutdown grace, the model configuration and the Triton repository it mounts."""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from launcher.cli import build_parser
from tritongate import registry
from tritongate.config import load_model_config
from tritongate.settings import DEPLOY_DIR, Settings, auto_workers
from tritongate.triton_local import TritonProcess

COMPOSE = DEPLOY_DIR / "compose.yaml"
OVERRIDES = [DEPLOY_DIR / "compose.gpu.yaml", DEPLOY_DIR / "compose.external-triton.yaml"]
SERVICES = registry.NAMES
DEFAULTS = Settings()


class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: merge keys, and the !reset / !override tags of override files."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    assert isinstance(node, yaml.ScalarNode)
    return loader.construct_scalar(node)


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, _untagged)


def dotenv(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values


class InterpolationError(Exception):
    pass


# One `${...}` with no other inside it (so nested defaults resolve from the inside out), or `$NAME`.
_VARIABLE = re.compile(r"\$\{(?P<braced>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^${}]*))?\}|\$(?P<plain>\w+)")
_ESCAPED = "\0"  # stands for `$$` (a literal `$`) while variables are replaced


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """The Compose Specification's interpolation: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error}, ${VAR:+alt}, ${VAR+alt}, nested (${A:-${B:-default}}), and $$ for a
    literal $."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        op, arg = match["op"], match["arg"] or ""
        current = env.get(name)
        empty = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-"):
            return arg if empty else str(current)
        if op in (":?", "?"):
            if empty:
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return str(current)
        if op in (":+", "+"):
            return "" if empty else arg
        return current or ""

    text, previous = value.replace("$$", _ESCAPED), None
    while text != previous:
        previous, text = text, _VARIABLE.sub(substitute, text)
    return text.replace(_ESCAPED, "$")


def load(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.load(path.read_text(), Loader=ComposeLoader)  # a SafeLoader subclass
    return interpolate(raw, dotenv(DEPLOY_DIR / ".env") if env is None else env)


@cache
def compose() -> dict[str, Any]:
    return load(COMPOSE)


@cache
def compose_schema() -> dict[str, Any]:
    """The Compose Specification schema as check-jsonschema vendors it (from compose-spec/compose-spec)."""
    text = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    return json.loads(text)


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def environment(name: str) -> dict[str, str]:
    env = service(name).get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def seconds(duration: str) -> float:
    """A Compose duration such as 40s, 2m or 1m30s."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def tritongate_args(command: list[str]) -> Any:
    """Parse a container command as the image's `tritongate` entry point receives it."""
    return build_parser().parse_args(command)


def healthcheck_args(name: str) -> Any:
    test = service(name)["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL"), test
    argv = test[1:] if test[0] == "CMD" else shlex.split(test[1])
    assert argv[0] == "tritongate", argv
    return tritongate_args(argv[1:])


@pytest.mark.parametrize("path", [COMPOSE, *OVERRIDES], ids=lambda p: p.name)
def test_validates_against_the_compose_specification(path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(compose_schema())
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(load(path))]
    assert errors == []


@pytest.mark.parametrize(("path", "value"), [
    (("services", "embed", "healthcheck", "interval"), ["10s"]),
    (("services", "edge", "depends_on", "embed", "condition"), "service_ready"),
    (("services", "embed", "stop_grace_priod"), "40s"),
])
def test_the_schema_check_catches_a_broken_file(path: tuple[str, ...], value: object) -> None:
    broken = load(COMPOSE)
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    assert not jsonschema.Draft202012Validator(compose_schema()).is_valid(broken)


def test_required_settings_fail_fast_with_a_message() -> None:
    text = COMPOSE.read_text()
    required = set(re.findall(r"\$\{(\w+):\?[^}]+\}", text))
    env = dotenv(DEPLOY_DIR / ".env")
    assert {"TRITONGATE_MODEL_CONFIG", "TRITON_MODEL_REPOSITORY", "TRITONGATE_MODELS"} <= required <= set(env)
    for name in required:
        for missing in ({k: v for k, v in env.items() if k != name}, {**env, name: ""}):
            with pytest.raises(InterpolationError, match=f"{name} is missing a value: set {name} to "):
                load(COMPOSE, missing)


def test_the_edge_reaches_every_service_by_dns_at_its_default_port() -> None:
    env = environment("edge")
    depends = service("edge")["depends_on"]
    for name in SERVICES:
        target = env[f"TRITONGATE_{name.upper()}_TARGET"]
        match = re.fullmatch(r"dns:///([\w-]+):(\d+)", target)
        assert match, target
        host, port = match[1], int(match[2])
        assert host == name and host in compose()["services"]
        assert port == DEFAULTS.port(name)
        assert f"TRITONGATE_{name.upper()}_PORT" not in environment(name)  # the service listens there too
        assert str(port) in service(name)["expose"]
        assert depends[name] == {"condition": "service_healthy"}


def test_commands_are_tritongate_subcommands_with_matching_health_checks() -> None:
    for name in (*SERVICES, "edge"):
        assert tritongate_args(service(name)["command"]).command == name
        check = healthcheck_args(name)
        assert (check.command, check.target) == ("health", name)
    assert tritongate_args(service("models")["command"]).models_command == "fetch"
    # The health check probes where the component listens: all interfaces in the container.
    for name in SERVICES:
        assert environment(name)["TRITONGATE_SERVICE_HOST"] == "0.0.0.0"
    assert environment("edge")["TRITONGATE_EDGE_HOST"] == "0.0.0.0"
    published = service("edge")["ports"][0].rsplit(":", 1)[1]
    assert int(published) == DEFAULTS.edge_port


def test_services_scale_without_changes() -> None:
    for name in SERVICES:
        spec = service(name)
        assert not {"container_name", "ports", "hostname"} & set(spec), name
        assert spec["restart"] == "unless-stopped"
        metrics = environment(name)["TRITONGATE_METRICS_PORT"]
        assert metrics in spec["expose"]


def test_a_site_names_its_own_triton_image_with_triton_image() -> None:
    env = dotenv(DEPLOY_DIR / ".env")
    assert "TRITON_IMAGE" not in env  # the default: the demo image, built on NVIDIA's
    triton = service("triton")
    assert triton["image"] == "tritongate-triton:local" and triton["build"]["context"] == "./triton"
    assert triton["build"]["args"]["TRITON_BASE_IMAGE"].startswith("nvcr.io/nvidia/tritonserver:")
    ours = load(COMPOSE, {**env, "TRITON_IMAGE": "registry.example.com/triton:1", "TRITONGATE_TAG": "t"})
    assert ours["services"]["triton"]["image"] == "registry.example.com/triton:1"
    tagged = load(COMPOSE, {**env, "TRITONGATE_TAG": "t"})["services"]
    assert {tagged[name]["image"] for name in ("triton", "edge", "models")} == {
        "tritongate-triton:t", "tritongate:t", "tritongate-models:t"}


def test_the_edges_share_state_in_valkey_that_keeps_nothing_on_disk() -> None:
    from edge.state import open_store

    url = environment("edge")["TRITONGATE_STATE_URL"]
    assert type(open_store(url)).__name__ == "RedisStore"
    host, port = re.fullmatch(r"redis://([\w-]+):(\d+)/\d+", url).groups()  # type: ignore[union-attr]
    valkey = service(host)
    assert valkey["image"] == "valkey/valkey:8-alpine" and port in valkey["expose"]
    site = load(COMPOSE, {**dotenv(DEPLOY_DIR / ".env"), "VALKEY_IMAGE": "redis:7"})
    assert site["services"][host]["image"] == "redis:7"
    command = valkey["command"]
    assert command[0] == "valkey-server" and command[command.index("--save") + 1] == ""
    assert command[command.index("--appendonly") + 1] == "no" and "volumes" not in valkey
    assert valkey["healthcheck"]["test"] == ["CMD", "valkey-cli", "ping"] and valkey["restart"] == "unless-stopped"
    assert service("edge")["depends_on"][host] == {"condition": "service_healthy"}


def test_every_long_running_service_is_restarted_so_start_order_is_only_a_courtesy() -> None:
    """podman-compose below podman 4.6 ignores `service_healthy` (and with --no-deps, all of depends_on):
    a part that starts before what it needs exits or waits, and is restarted (tests/containers proves it)."""
    for name, spec in compose()["services"].items():
        if name != "models":
            assert spec["restart"] == "unless-stopped", name


def test_start_order_is_gated_on_health() -> None:
    assert service("triton")["depends_on"] == {"models": {"condition": "service_completed_successfully"}}
    for name in SERVICES:
        assert service(name)["depends_on"] == {"triton": {"condition": "service_healthy"}}
        assert service(name)["healthcheck"]["start_period"]
    assert "healthcheck" in service("triton") and service("models")["restart"] == "no"


def test_stop_grace_periods_let_requests_in_flight_finish() -> None:
    for name in (*SERVICES, "edge"):
        grace = float(environment(name)["TRITONGATE_SHUTDOWN_GRACE_S"])
        assert seconds(service(name)["stop_grace_period"]) >= grace + 5, name
    # The edge outlasts the longest stream it forwards.
    assert float(environment("edge")["TRITONGATE_SHUTDOWN_GRACE_S"]) >= float(
        environment("llm")["TRITONGATE_SHUTDOWN_GRACE_S"])


def test_services_read_the_mounted_model_config_and_triton_serves_its_models() -> None:
    env = dotenv(DEPLOY_DIR / ".env")
    config_file = (DEPLOY_DIR / env["TRITONGATE_MODEL_CONFIG"]).resolve()
    repository = (DEPLOY_DIR / env["TRITON_MODEL_REPOSITORY"]).resolve()
    for name in SERVICES:
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service(name)["volumes"]}
        assert (DEPLOY_DIR / mounts[environment(name)["TRITONGATE_CONFIG_FILE"]]).resolve() == config_file
        assert mounts[environment(name)["TRITONGATE_MODELS_DIR"]] == env["TRITONGATE_MODELS"]
    triton = service("triton")
    triton_mounts = {v.split(":")[1]: v.split(":")[0] for v in triton["volumes"]}
    flag = next(arg for arg in triton["command"] if arg.startswith("--model-repository="))
    assert (DEPLOY_DIR / triton_mounts[flag.split("=", 1)[1]]).resolve() == repository
    assert triton_mounts[triton["environment"]["TRITONGATE_MODELS_DIR"]] == env["TRITONGATE_MODELS"]

    config = load_model_config(config_file)
    for info in registry.SERVICES:
        entries = getattr(config, info.section)
        assert entries, f"the compose config serves no {info.section} model, but runs the {info.name} service"
        for entry in entries:
            host, port = entry.triton_grpc_url.rsplit(":", 1)
            assert host == "triton" and port in triton["expose"]
            assert (repository / entry.triton_name / "config.pbtxt").is_file(), entry.triton_name


def test_compose_config_is_the_demo_config_on_the_triton_service() -> None:
    """Every model of deploy/model_config.json that the Triton image serves (deploy/triton) runs in compose
    too, configured the same way; `tritongate up` adds the TensorRT-LLM demo LLM of deploy/triton-llm-backends."""
    demo = json.loads((DEPLOY_DIR / "model_config.json").read_text())
    ours = json.loads((DEPLOY_DIR / dotenv(DEPLOY_DIR / ".env")["TRITONGATE_MODEL_CONFIG"]).read_text())
    served = {path.name for path in (DEPLOY_DIR / "triton").iterdir()}
    demo["model_infos"] = [info for info in demo.get("model_infos", []) if info["name"] in served]
    for section in (info.section for info in registry.SERVICES):
        by_name = {entry["name"]: entry for entry in ours.get(section, [])}
        for entry in (entry for entry in demo.get(section, []) if entry.get("triton_model", entry["name"]) in served):
            assert entry["name"] in by_name, f"{section} model {entry['name']} is missing from the compose config"
            differs = {k for k in entry.keys() | by_name[entry["name"]].keys()
                       if k not in ("url", "grpc_url") and entry.get(k) != by_name[entry["name"]].get(k)}
            assert not differs, f"{section} {entry['name']}: {sorted(differs)} differ from deploy/model_config.json"
    for info in demo.get("model_infos", []):
        assert info in ours.get("model_infos", []), info["name"]


def test_triton_image_is_the_release_the_tests_run(triton: TritonProcess) -> None:
    """The compose Triton (NGC tag YY.MM) is the Triton the test suite runs (nvidia-pytriton's binary)."""
    version = httpx.get(f"http://127.0.0.1:{triton.http_port}/v2", timeout=5).json()["version"]
    image = compose()["services"]["triton"]["build"]["args"]["TRITON_BASE_IMAGE"]
    tag = re.search(r"tritonserver:(\d\d)\.(\d\d)-py3", image)
    assert tag
    # NGC publishes one Triton minor release a month: 24.10 is 2.51, 24.11 is 2.52, ...
    minor = 51 + (int(tag[1]) - 24) * 12 + (int(tag[2]) - 10)
    assert version.startswith(f"2.{minor}."), (version, tag[0])
    dockerfile = (DEPLOY_DIR / "triton" / "Dockerfile").read_text()
    assert f"ARG TRITON_BASE_IMAGE=nvcr.io/nvidia/{tag[0]}" in dockerfile


def test_gpu_override_reserves_gpus_for_triton_only() -> None:
    override = load(DEPLOY_DIR / "compose.gpu.yaml")
    assert set(override["services"]) == {"triton"}
    devices = override["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def test_external_triton_override_drops_only_the_triton_dependencies() -> None:
    override = load(DEPLOY_DIR / "compose.external-triton.yaml")
    assert set(override["services"]) == set(SERVICES)
    for name in SERVICES:
        assert override["services"][name]["depends_on"] == {}
        assert set(service(name)["depends_on"]) == {"triton"}  # all that it resets


def test_the_edge_runs_workers_as_tritongate_up_does() -> None:
    workers = environment("edge")["TRITONGATE_EDGE_WORKERS"]  # as interpolated with deploy/.env
    assert workers == "auto"
    assert Settings(edge_workers=workers).edge_workers == auto_workers()  # type: ignore[arg-type]
