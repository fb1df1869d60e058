"""The launcher reads the services from tritongate/registry.py: one command, one edge target flag, one
health name and one pair of environment variables per entry, all agreeing with the settings."""

from __future__ import annotations

import os

import pytest

from launcher.cli import build_parser, settings_from
from launcher.healthcheck import resolve
from launcher.stack import LocalStack, needed_services
from tritongate.config import ModelConfig
from tritongate.registry import NAMES, SERVICES, ServiceInfo
from tritongate.settings import Settings


@pytest.mark.parametrize("service", SERVICES, ids=NAMES)
def test_every_service_has_its_command_with_its_port(service: ServiceInfo) -> None:
    args = build_parser().parse_args([service.name, "--port", "40123", "--host", "0.0.0.0"])
    settings = settings_from(args)
    assert settings.port(service) == 40123 and settings.service_host == "0.0.0.0"
    assert all(settings.port(other) == other.default_port for other in SERVICES if other != service)


def test_the_edge_takes_a_target_flag_per_service() -> None:
    flags = [f"--{name}=dns:///{name}-replicas:1234" for name in NAMES]
    settings = settings_from(build_parser().parse_args(["edge", *flags]))
    assert [settings.target(name) for name in NAMES] == [f"dns:///{name}-replicas:1234" for name in NAMES]
    untouched = settings_from(build_parser().parse_args(["edge"]))
    assert [untouched.target(s) for s in SERVICES] == [f"127.0.0.1:{s.default_port}" for s in SERVICES]


@pytest.mark.parametrize("service", SERVICES, ids=NAMES)
def test_health_resolves_a_service_name_to_its_port_on_this_host(service: ServiceInfo) -> None:
    settings = Settings(service_host="0.0.0.0", **{f"{service.name}_port": 40124})  # type: ignore[arg-type]
    assert resolve(service.name, settings) == "127.0.0.1:40124"
    assert resolve("10.0.0.7:50000", settings) == "10.0.0.7:50000"
    assert resolve("edge", Settings(edge_port=5200)) == "http://127.0.0.1:5200/health"


def test_the_stack_hands_each_service_its_port_and_the_edge_its_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    given = Settings(**{f"{name}_port": 41000 + i for i, name in enumerate(NAMES)})  # type: ignore[arg-type]
    env = LocalStack(given).env()
    for name in [name for name in os.environ if name.startswith("TRITONGATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("TRITONGATE_"):
            monkeypatch.setenv(name, value)
    child = Settings()  # what a child process reads from that environment
    for service in SERVICES:
        assert child.port(service) == given.port(service)
        assert child.target(service) == f"127.0.0.1:{given.port(service)}"


def test_the_stack_starts_the_services_whose_section_has_models() -> None:
    entry = {"name": "m", "url": "127.0.0.1:8001", "path": "/nonexistent"}
    assert needed_services(ModelConfig()) == []
    for service in SERVICES:
        config = ModelConfig.model_validate({service.section: [entry]})
        assert needed_services(config) == [service]


def test_workers_auto_is_one_process_per_four_cores_at_least_one() -> None:
    from launcher.workers import parse_workers
    from tritongate.settings import auto_workers

    assert [auto_workers(n) for n in (1, 2, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8]
    assert parse_workers("3") == 3 and parse_workers("auto") == auto_workers()
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="auto"):
            parse_workers(bad)


def test_up_takes_workers_for_all_and_per_component() -> None:
    args = build_parser().parse_args(["up", "--workers", "1", "--embed-replicas", "3"])
    assert args.workers == "1" and args.embed_replicas == "3" and args.edge_workers is None
    assert build_parser().parse_args(["up"]).workers == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--workers", "0"])
    assert settings_from(build_parser().parse_args(["edge", "--workers", "4"])).edge_workers == 4
    assert Settings(edge_workers="auto").edge_workers >= 1  # type: ignore[arg-type]  # as TRITONGATE_EDGE_WORKERS=auto


def test_replicas_are_one_target_the_edge_balances_over() -> None:
    from launcher.workers import REPLICA_PORT_STEP, replicas_target

    stack = LocalStack(Settings(embed_port=41000), processes={"embed": 3})
    assert stack.replica_ports("embed") == [41000, 41000 + REPLICA_PORT_STEP, 41000 + 2 * REPLICA_PORT_STEP]
    assert stack.service_address("embed") == "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in stack.replica_ports("embed"))
    assert stack.service_address("llm") == f"127.0.0.1:{stack.settings.port('llm')}"  # one replica: as before
    assert replicas_target("0.0.0.0", [1, 2]) == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert replicas_target("::", [1, 2]) == "ipv6:[::1]:1,[::1]:2"
