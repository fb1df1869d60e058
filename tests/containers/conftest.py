"""Session fixtures of the container tier: the engine (installed on first use; where it cannot be, every
test skips with the reason), the images, and deploy/compose.yaml up as its own compose project, taken
down at the end whatever happened. The timings and results the tests measure are printed at the end of
the run (`container tier:` lines) and written to test-output/containers/results.json with the
containers' logs (both removed at the start of a run, so what is there is the last run's)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.containers import engine as containers
from tests.containers.compose import Compose, sandbox_override
from tritongate.settings import REPO_ROOT

OUTPUT = Path(os.environ.get("TRITONGATE_TEST_OUTPUT", REPO_ROOT / "test-output")) / "containers"
RESULTS = pytest.StashKey[dict[str, Any]]()
STARTUP_TIMEOUT_S = 1200  # a cold start fetches the demo models and converts the LLM before Triton loads them
SERVICES = ["valkey", "triton", "llm", "embed", "rerank", "edge"]  # every long-running service of compose.yaml


@pytest.fixture(scope="session")
def results(pytestconfig: pytest.Config) -> dict[str, Any]:
    """What the tier measured, by name (printed and saved at the end)."""
    return pytestconfig.stash.setdefault(RESULTS, {})


@pytest.fixture(scope="session")
def engine() -> containers.Engine:
    clear_output()
    try:
        return containers.provision()
    except containers.Unavailable as exc:
        pytest.skip(f"no container engine: {exc}")


@pytest.fixture(scope="session")
def images(engine: containers.Engine, results: dict[str, Any]) -> dict[str, str]:
    started = time.monotonic()
    built = containers.build_images(engine)
    results["images_build_s"] = round(time.monotonic() - started, 1)
    return built


@pytest.fixture(scope="session")
def compose(engine: containers.Engine, images: dict[str, str]) -> Iterator[Compose]:
    """The compose project, with nothing of it left before or after (its logs are kept)."""
    project = Compose(engine, {
        "TRITONGATE_TAG": containers.TAG,
        "TRITON_IMAGE": images["triton"],
        "VALKEY_IMAGE": images["valkey"],
        # Each edge replica on its own free loopback port: nothing fixed to collide with on a shared machine.
        "TRITONGATE_EDGE_PUBLISH": "127.0.0.1:",
        "TRITONGATE_EDGE_WORKERS": "1",
    }, sandbox_override(images["triton"]))
    project.down(check=False)  # what an interrupted run may have left
    project.sweep()
    try:
        yield project
    finally:
        save_logs(project)  # a run that stopped before the `down` test (which saves them itself)
        project.down(check=False)
        project.sweep()


@pytest.fixture(scope="session")
def stack(compose: Compose, results: dict[str, Any]) -> Compose:
    """`compose up`, and every container healthy: on a first start Triton and the services exit until the
    models are fetched, and are restarted by their restart policies (Compose.up)."""
    started = time.monotonic()
    compose.up()
    for service in SERVICES:
        compose.wait_healthy(compose.containers(service), STARTUP_TIMEOUT_S)
    results["up_to_healthy_s"] = round(time.monotonic() - started, 1)
    return compose


def clear_output() -> None:
    """Nothing of an earlier run in the output folder: the logs and results there are this run's."""
    for stale in [*OUTPUT.glob("*.log"), OUTPUT / "results.json"]:
        stale.unlink(missing_ok=True)


def save_logs(compose: Compose) -> None:
    """The containers' logs, while the containers exist (before `down` removes them)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for container in compose.containers(running=False):
        logs = compose.engine.podman("logs", "--tail", "300", container, check=False)
        (OUTPUT / f"{container}.log").write_text(logs.stdout + logs.stderr)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS, None)
    if not results:
        return
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    terminalreporter.write_sep("-", "container tier")
    for name, value in results.items():
        terminalreporter.write_line(f"container tier: {name} = {value}")
